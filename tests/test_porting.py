"""docs/porting.md's tables hold: every original Slapo spelling listed there either still works
("same") or raises a SlapoError whose hint contains the table's third column. The rows are read
from the page itself, so a row without a case here, a case without a row, or a spelling that
stops giving its hint fails this test."""

import pathlib
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import slapo
import slapo.op
import slapo.pipeline
from slapo import call_module
from slapo.model_schedule import apply_schedule, check_knobs
from slapo.testing import MLP, tiny_model

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "porting.md"
_CODE = re.compile(r"`([^`]+)`")


def porting_rows():
    """``(original spelling, hint or None for "same")`` of every table row of docs/porting.md."""
    rows = []
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        assert len(cells) == 3, f"docs/porting.md: a row needs 3 cells: {line}"
        spelling = _CODE.search(cells[0]).group(1)
        hint = None if cells[2] == "same" else _CODE.search(cells[2]).group(1)
        rows.append((spelling, hint))
    return rows


# ------------------------------------------------------------------ helpers for the cases
def _mlp():
    return slapo.create_schedule(MLP())


def _traced():
    sch = _mlp()
    sch.trace(example_inputs=(torch.randn(2, 16),))
    return sch


class _TwoInputs(nn.Module):
    def forward(self, a, b):
        return F.relu(a) + b


class _SharedIntermediate(nn.Module):
    def forward(self, x):
        h = F.relu(x)
        return F.gelu(h) + h


def _traced_module(mod, *inputs):
    sch = slapo.create_schedule(mod)
    sch.trace(example_inputs=inputs)
    return sch


def _same_tree():
    sch = _mlp()
    node = sch["fc1"]
    assert "fc1" in sch and node.mod is sch.mod.fc1 and node.path == "fc1"
    assert node.parent is sch and "fc1" in sch.child and node.group is None
    assert (sch.world_size, sch.rank) == (1, 0)
    assert [name for name, _ in sch.named_schedules()][:2] == ["", "fc1"]


def _hooked_subgraph():
    sch = _traced()
    sch["fc1"].sync("fwd_post", lambda mod, args, out: out)
    found = sch.find(lambda x: F.gelu(call_module("fc1", x)))
    sch.replace(nn.Sequential(nn.Linear(16, 32), nn.GELU()), found)


def _verify_block(*args, **kwargs):
    sch = _mlp()
    with slapo.Verify(sch, (torch.randn(2, 16),), *args, **kwargs) as check:
        sch["act"].replace(nn.GELU())
    assert check.report.ok


def _knobs(name, **knobs):
    apply_schedule(tiny_model("bert"), name, **knobs)


# ------------------------------------------------------------------ one case per row
CASES = {
    # top-level names
    "slapo.create_schedule(model, group=None)": lambda: slapo.create_schedule(MLP(), group=None),
    "slapo.build(sch, target=None, init_weights=...)": lambda: slapo.build(_mlp(), target=None),
    "slapo.list_primitives()": lambda: slapo.list_primitives(),
    "slapo.register_primitive": lambda: slapo.register_primitive,
    "slapo.Verify(sch, example_inputs)": lambda: slapo.Verify(_mlp(), (torch.randn(2, 16),)),
    "slapo.Verify(sch, example_inputs, eval_mode=True, enable=True)":
        lambda: _verify_block(eval_mode=True, enable=True),
    'slapo.Verify(sch, example_inputs, device="cuda")': lambda: _verify_block(device="cuda"),
    'slapo.Verify(sch, example_inputs, "cuda", True, True)':
        lambda: _verify_block("cuda", True, True),
    "slapo.init_empty_weights()": lambda: slapo.init_empty_weights(),
    "slapo.checkpoint(fn, *args)": lambda: slapo.checkpoint(torch.sin, torch.ones(2)),
    "slapo.set_random_seed(seed, tp_rank=...)": lambda: slapo.set_random_seed(2013, tp_rank=0),
    "slapo.is_random_seed_set()": lambda: slapo.is_random_seed_set(),
    "slapo.get_cuda_rng_tracker()": lambda: slapo.get_cuda_rng_tracker(),
    "slapo.random": lambda: slapo.random,
    "slapo.random.model_parallel_cuda_manual_seed(seed, tp_rank)":
        lambda: slapo.random.model_parallel_cuda_manual_seed(2013, 0),
    "from slapo.random import model_parallel_cuda_manual_seed":
        lambda: exec("from slapo.random import model_parallel_cuda_manual_seed", {}),
    "from slapo import get_cuda_rng_tracker":
        lambda: exec("from slapo import get_cuda_rng_tracker", {}),
    "from slapo.op import FusedMLP": lambda: exec("from slapo.op import FusedMLP", {}),
    "slapo.get_logger(name)": lambda: slapo.get_logger("x"),
    "slapo.env.setup(rank, world_size)": lambda: slapo.env.setup(0, 1),
    "slapo.initialization": lambda: slapo.initialization,
    "slapo.ScheduleMetadata": lambda: slapo.ScheduleMetadata,
    "slapo.framework_dialect": lambda: slapo.framework_dialect,
    "slapo.Space": lambda: slapo.Space,
    "slapo.Symbol": lambda: slapo.Symbol,
    "slapo.Database": lambda: slapo.Database,
    "slapo.pattern.call_module": lambda: slapo.pattern.call_module,
    "slapo.Pattern": lambda: slapo.Pattern,
    'slapo.ModulePattern("fc?")': lambda: slapo.ModulePattern("fc?"),
    # the schedule tree and find
    "sch[path]": _same_tree,
    "sch.find_node(regex)": lambda: _traced().find_node("fc1"),
    "sch.find_subgraph(pattern)": lambda: _traced().find_subgraph(lambda x: F.gelu(x)),
    "sch.get_module(name)": lambda: _mlp().get_module("fc1"),
    "sch.get_top_schedule()": lambda: _mlp()["fc1"].get_top_schedule(),
    'parent, node = sch.find("fc1")[0]': lambda: tuple(_traced().find("fc1")[0]),
    # primitive arguments
    'sch.trace(tracer="pytorch")': lambda: _mlp().trace((torch.randn(2, 16),), tracer="pytorch"),
    'sch.trace(tracer="huggingface")':
        lambda: _mlp().trace((torch.randn(2, 16),), tracer="huggingface"),
    'sch.trace(tracer="dynamo")': lambda: _mlp().trace((torch.randn(2, 16),), tracer="dynamo"),
    "sch.trace(concrete_args={...})": lambda: _mlp().trace(concrete_args={"x": None}),
    "sch.trace(leaf_modules=[...])": lambda: _mlp().trace(leaf_modules=["Linear"]),
    "sch.trace(config=hf_config)": lambda: _mlp().trace(config=None),
    "sch.trace(flatten=True)": lambda: _mlp().trace((torch.randn(2, 16),), flatten=True),
    "sch.trace_until(paths, leaf_modules=[...])":
        lambda: _mlp().trace_until("fc1", leaf_modules=["Linear"]),
    'sch.fuse(subgraph, compiler="TorchScript")':
        lambda: _fuse("TorchScript"),
    "sch.fuse(subgraph, compiler=None)": lambda: _fuse(None),
    "sch.replace(new, target_ops=subgraphs)":
        lambda: _traced().replace(nn.GELU(), target_ops=[]),
    'sch.replace(new, subgraph, name="x", concrete_args={...})': lambda: _replace_with_kwargs(),
    "sch.checkpoint(order_args_fn=fn)": lambda: _mlp()["fc1"].checkpoint(order_args_fn=None),
    'sch.shard("weight", axis=0)': lambda: _mlp()["fc1"].shard("weight", axis=0),
    'sch.sync("bwd_post", "all_reduce")': lambda: _mlp()["fc1"].sync("bwd_post", "all_reduce"),
    "sch.replace_all(nn.GELU, make_fn)": lambda: _mlp().replace_all(nn.GELU,
                                                                    lambda path, old: nn.ReLU()),
    "sch.checkpoint()": lambda: _mlp()["fc1"].checkpoint(),
    "sch.decompose()": lambda: _mlp()["fc1"].decompose(),
    "sch.fork_rng()": lambda: _mlp()["drop"].fork_rng(),
    'sch.annotate("weight", "key", value)': lambda: _mlp()["fc1"].annotate("weight", "key", 1),
    "sch.trace_until(paths)": lambda: _mlp().trace_until("", example_inputs=torch.randn(2, 16)),
    "sch.cut_pipeline_stage()": lambda: _cut(),
    **{f'sch.sync("fwd_post", "{spec}")': (lambda spec=spec: _mlp()["act"].sync("fwd_post", spec))
       for spec in ("RS->RR", "SR->RR", "RR->RS", "RR->SR", "RS->SR", "SR->RS")},
    # ops and pipeline helpers
    **{f"slapo.op.{name}": (lambda name=name: getattr(slapo.op, name)) for name in (
        "FlashAttention", "FlashAttentionOp", "FusedMLP", "FusedQKV", "LinearWithSeparateBias",
        "LinearWithSyncFunc", "LinearWithAct", "LinearWithDropout", "ParallelCrossEntropy",
        "vocab_parallel_cross_entropy", "Print")},
    "slapo.op.bias_new_gelu(x, bias)": lambda: slapo.op.bias_new_gelu,
    "slapo.op.new_gelu(x)": lambda: slapo.op.new_gelu,
    "slapo.op.bias_dropout(x, bias, p)": lambda: slapo.op.bias_dropout,
    **{f"slapo.sharding.{name}": (lambda name=name: getattr(slapo.sharding, name.split("(")[0]))
       for name in ("all_gather_forward_output(x, dim, group)",
                    "reduce_scatter_forward_output(x, dim, group)",
                    "scatter_forward_output(x, dim, group)", "reduce_forward_output(x, group)",
                    "reduce_backward_grad(x, group)", 'parse_reshard("RS->SR", group)',
                    "register_shard_method(cls)")},
    "slapo.utils.report": lambda: slapo.utils.report,
    "slapo.pipeline.generate_pipeline_partition(sch)":
        lambda: slapo.pipeline.generate_pipeline_partition(_mlp()),
    "slapo.pipeline.analyze_tie_weights(model)":
        lambda: slapo.pipeline.analyze_tie_weights(MLP()),
    # model-schedule knobs
    'apply_schedule(model, "bert", model_config=config, ckpt_ratio=0.5)':
        lambda: check_knobs("bert", ckpt_ratio=0.5),
    'apply_schedule(model, "gpt_neo", prefix="transformer", delay_init=True, '
    'sequence_parallel=True)':
        lambda: check_knobs("gpt_neo", prefix="transformer", delay_init=True,
                            sequence_parallel=True),
    'apply_schedule(model, "bert", fp16=True)': lambda: _knobs("bert", fp16=True),
    'apply_schedule(model, "bert", bf16=True)': lambda: _knobs("bert", bf16=True),
    'apply_schedule(model, "bert", attn_op_name="cuda")':
        lambda: _knobs("bert", attn_op_name="cuda"),
    'apply_schedule(model, "bert", disable_fuse_bias_gelu=False)':
        lambda: _knobs("bert", disable_fuse_bias_gelu=False),
    'apply_schedule(model, "wideresnet", fuse_conv=True)':
        lambda: _knobs("wideresnet", fuse_conv=True),
    'apply_schedule(model, "bert", bcast_input=True)': lambda: _knobs("bert", bcast_input=True),
    'apply_schedule(model, "gpt2", checkpoint_method="head")':
        lambda: _knobs("gpt2", checkpoint_method="head"),
    # deliberate differences
    "sch.replace(new, subgraph)": _hooked_subgraph,
    'sch.find(lambda x: call_module("fc", x))':
        lambda: _traced().find(lambda x: call_module("fc", x)),
    "sch.find(lambda x: F.relu(x) + x)":
        lambda: _traced_module(_TwoInputs(), torch.randn(3), torch.randn(3)).find(
            lambda x: F.relu(x) + x),
    "sch.find(lambda x: F.gelu(F.relu(x)))":
        lambda: _traced_module(_SharedIntermediate(), torch.randn(3)).find(
            lambda x: F.gelu(F.relu(x))),
}


def _cut():
    sch = _mlp()
    sch.trace_until("", example_inputs=torch.randn(2, 16))
    sch["act"].cut_pipeline_stage()


def _fuse(compiler):
    sch = _traced()
    sch.fuse(sch.find(lambda x: F.gelu(call_module("fc1", x))), compiler=compiler)


class _Scaled(nn.Module):
    def forward(self, x, k):
        return F.gelu(x) * k


def _replace_with_kwargs():
    sch = _traced()
    sch.replace(_Scaled(), sch.find(lambda x: F.gelu(x)), name="x", concrete_args={"k": 1.0})
    assert sch.mod(torch.ones(1, 16)).shape == (1, 16)

ROWS = porting_rows()


def test_every_row_has_a_case_and_every_case_a_row():
    listed = [spelling for spelling, _ in ROWS]
    assert len(listed) == len(set(listed)), "a spelling is listed twice in docs/porting.md"
    assert not set(listed) - set(CASES), f"rows without a case: {set(listed) - set(CASES)}"
    assert not set(CASES) - set(listed), f"cases without a row: {set(CASES) - set(listed)}"
    assert len(listed) >= 60


@pytest.mark.parametrize("spelling,hint", ROWS, ids=[s for s, _ in ROWS])
def test_original_spelling_works_or_names_the_replacement(spelling, hint):
    case = CASES[spelling]
    if hint is None:
        case()
        return
    with pytest.raises(slapo.SlapoError) as info:
        case()
    message = str(info.value)
    assert "Hint: " in message, f"{spelling}: no hint in {message}"
    assert hint in message.split("Hint: ", 1)[1], f"{spelling}: hint lacks {hint!r}: {message}"


def test_module_names_are_attribute_and_import_errors():
    assert not hasattr(slapo, "random") and not hasattr(slapo.op, "FusedMLP")
    assert getattr(slapo.pipeline, "analyze_tie_weights", None) is None
    with pytest.raises(ImportError, match="Hint: slapo.get_rng_tracker()"):
        exec("from slapo import get_cuda_rng_tracker", {})
    with pytest.raises(ImportError, match="Hint: the RNG helpers are top-level"):
        exec("import slapo.random", {})
    with pytest.raises(ImportError, match="cannot import name 'nope'"):  # plain otherwise
        exec("from slapo import nope", {})
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        slapo.nope  # noqa: B018 - a name the original never had: a plain AttributeError


DIFFERENCES = ["sch.replace(new, subgraph)", 'sch.find(lambda x: call_module("fc", x))',
               "sch.find(lambda x: F.relu(x) + x)", "sch.find(lambda x: F.gelu(F.relu(x)))"]


@pytest.mark.parametrize("spelling", DIFFERENCES)
def test_deliberate_differences_say_why(spelling):
    """The error of each deliberate difference says what the original did and why we refuse."""
    with pytest.raises(slapo.SlapoError) as info:
        CASES[spelling]()
    why = str(info.value).split("Hint: ", 1)[0]
    assert "the original" in why, why


def test_call_module_works_through_the_package_attribute():
    sch = _traced()
    found = sch.find(lambda x: F.gelu(slapo.call_module("fc.", x)))
    assert [n.target for n in found[0].nodes] == ["fc1", "act"]
