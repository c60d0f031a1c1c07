"""Trace-fidelity sweep (issue #39): every module a shipped recipe traces, and each paper
model's attention and MLP blocks, traced in training and in evaluation mode, computes what the
untraced module computes in both modes (forward and backward, same RNG stream, dropout on,
another batch and sequence length than the trace's), or refuses with one line. The default
tracer and the dynamo tracer."""

from __future__ import annotations

import pytest

from slapo.model_schedule.common import layer_paths
from slapo.model_schedule.pipeline_cuts import caller_of
from slapo.testing import example_inputs, tiny_config, tiny_model
from slapo.testing.models import PLAN_FAMILIES, tiny_plan_config, tiny_plan_model
from tests.trace.fidelity import COUNTS, REFUSALS, check_fidelity, dropout_overrides

TRACE_INPUTS = dict(batch=2, seq=8)
RUN_INPUTS = dict(batch=3, seq=5)


def _hf(family):
    config = tiny_config(family)
    over = dropout_overrides(config)
    if hasattr(config, "use_cache"):
        over["use_cache"] = False  # training; the recipes turn the KV cache off
    return lambda: tiny_model(family, **over)


# The layer stacks the recipes cut after (model_schedule/*.py); their callers are traced.
RECIPE_STACKS = {
    "bert": ["bert.encoder.layer"], "roberta": ["roberta.encoder.layer"],
    "gpt2": ["transformer.h"], "gpt_neo": ["transformer.h"], "opt": ["model.decoder.layers"],
    "t5": ["encoder.block", "decoder.block"], "llama": ["model.layers"],
}


def _trace_callers(stacks, inputs):
    def schedule(sch):
        layers = [p for stack in stacks for p in layer_paths(sch, stack)]
        sch.trace_until(sorted({caller_of(sch, p) for p in layers}), example_inputs=inputs)
    return schedule


@pytest.mark.parametrize("family", sorted(RECIPE_STACKS))
def test_recipe_traces(family):
    check_fidelity(_hf(family), _trace_callers(RECIPE_STACKS[family],
                                               example_inputs(family, **TRACE_INPUTS)),
                   example_inputs(family, **RUN_INPUTS), f"recipe {family}")


@pytest.mark.parametrize("family", PLAN_FAMILIES)
def test_auto_recipe_traces(family):
    over = dropout_overrides(tiny_plan_config(family))
    inputs = example_inputs(family, **TRACE_INPUTS)
    inputs.pop("attention_mask")  # causal LMs: padding is not what is checked here
    run = example_inputs(family, **RUN_INPUTS)
    run.pop("attention_mask")
    check_fidelity(lambda: tiny_plan_model(family, **over),
                   _trace_callers(["model.layers"], inputs), run, f"auto {family}")


def test_wideresnet_recipe_traces():
    from tests.model_schedule.helpers import wideresnet, wideresnet_inputs

    inputs = wideresnet_inputs()
    run = {k: v[:1].repeat(3, *([1] * (v.dim() - 1))) for k, v in inputs.items()}
    run["pixel_values"] = run["pixel_values"][..., :24, :28] + 0.5
    stacks = [f"model.layer{k}" for k in range(1, 5)]
    cells = check_fidelity(wideresnet, _trace_callers(stacks, inputs), run, "recipe wideresnet")
    assert all(c[2] == "equal" for c in cells)  # batch norm is a module call: exact


# (family, path, trace options): attention and MLP blocks of the paper models.
BLOCKS = [
    ("bert", "bert.encoder.layer.0.attention.self", dict(recursive=False, flatten=True)),
    ("bert", "bert.encoder.layer.0.attention", {}),
    ("bert", "bert.encoder.layer.1.intermediate", {}),
    ("bert", "bert.encoder.layer.1.output", {}),
    ("roberta", "roberta.encoder.layer.0.attention", dict(flatten=True)),
    ("albert", "albert.encoder.albert_layer_groups.0.albert_layers.0", dict(flatten=True)),
    ("gpt2", "transformer.h.0.attn", dict(leaves=["Conv1D"], flatten=True)),
    ("gpt2", "transformer.h.0.mlp", dict(leaves=["Conv1D"])),
    ("gpt_neo", "transformer.h.0.attn", dict(flatten=True)),
    ("gpt_neo", "transformer.h.1.attn.attention", {}),  # local attention
    ("gpt_neo", "transformer.h.0.mlp", {}),
    ("opt", "model.decoder.layers.0.self_attn", dict(flatten=True)),
    ("opt", "model.decoder.layers.0", {}),
    ("t5", "encoder.block.0.layer.0", dict(flatten=True)),
    ("t5", "decoder.block.1.layer.2", {}),
    ("llama", "model.layers.0.self_attn", dict(flatten=True)),
    ("llama", "model.layers.0.mlp", {}),
]


def _trace_block(path, options, inputs):
    def schedule(sch):
        sch[path].trace(example_inputs=inputs, **options)
    return schedule


@pytest.mark.parametrize("family,path,options", BLOCKS,
                         ids=[f"{f}:{p}:{'flat' if o.get('flatten') else 'tree'}"
                              for f, p, o in BLOCKS])
def test_blocks(family, path, options):
    check_fidelity(_hf(family), _trace_block(path, options,
                                             example_inputs(family, **TRACE_INPUTS)),
                   example_inputs(family, **RUN_INPUTS), f"{family}:{path}")


DYNAMO_BLOCKS = [
    ("bert", "bert.encoder.layer.0.attention.self"),
    ("bert", "bert.encoder.layer.0.intermediate"),
    ("gpt2", "transformer.h.0.attn"),
    ("opt", "model.decoder.layers.0.self_attn"),
    ("llama", "model.layers.0.self_attn"),
    ("llama", "model.layers.0.mlp"),
]


@pytest.mark.parametrize("family,path", DYNAMO_BLOCKS, ids=[f"{f}:{p}" for f, p in DYNAMO_BLOCKS])
def test_dynamo_blocks(family, path):
    check_fidelity(_hf(family), _trace_block(path, dict(tracer="dynamo"),
                                             example_inputs(family, **TRACE_INPUTS)),
                   example_inputs(family, **RUN_INPUTS), f"dynamo {family}:{path}")


def test_zz_sweep_summary(capsys):
    """Runs last: the sweep's counts (``pytest -s`` shows them); nothing differed silently."""
    with capsys.disabled():
        print(f"\ntrace fidelity sweep: {dict(COUNTS)}")
        for line in REFUSALS:
            print("  refused:", line)
