"""``trace(tracer="dynamo")``: a flat torch.export graph in the module's place; the model trains
as before (outputs and gradients against the unscheduled model, 1 and 2 gloo ranks, with
tensor-parallel shards inside the traced module); ``find`` / ``fuse`` / subgraph ``replace``
work on its graph or refuse with a hint."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

import slapo
from slapo import PatternError, TraceError
from slapo.testing import assert_same_training, run_distributed
from slapo.trace.dynamo import from_module, is_dynamo_graph
from tests.sharding.helpers import train_and_compare


class Block(nn.Module):
    """A type check on an activation (the default tracer answers it from the example value,
    see tests/trace/test_tracer.py; dynamo runs it on a fake tensor)."""

    def __init__(self, bias: bool = True, p: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8, bias=bias)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        h = self.fc1(x)
        if isinstance(h, torch.Tensor):
            h = h * 2.0
        return self.drop(self.fc2(F.gelu(h + 1.0)))


class Top(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.block = Block(**kw)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.block(x) + x)


def _pair(**kw):
    torch.manual_seed(0)
    ref = Top(**kw)
    return ref, copy.deepcopy(ref)


def _x(batch=2, seq=4):
    return (torch.randn(batch, seq, 8, generator=torch.Generator().manual_seed(batch * seq)),)


def test_dynamo_graph_trains_like_the_module():
    ref, model = _pair()
    sch = slapo.create_schedule(model)
    gm = sch["block"].trace(example_inputs=_x(), tracer="dynamo")
    assert is_dynamo_graph(gm) and model.block is gm
    assert not any(n.op == "call_module" and n.target.startswith("fc") for n in gm.graph.nodes)
    assert list(model.state_dict()) == list(ref.state_dict())
    assert model.block.fc1.weight is gm.get_parameter("fc1.weight")
    for inputs in (_x(), _x(3, 5)):  # other batch and sequence sizes too
        assert_same_training(ref, model, inputs)
    # slapo.verify checks it (in eval mode: dropout with p=0 does not depend on the mode)
    assert slapo.verify(sch, _x(), reference=copy.deepcopy(ref)).ok
    # the recorded history replays the dynamo trace on a fresh model
    fresh = copy.deepcopy(ref)
    sch.history.replay(fresh)
    assert is_dynamo_graph(fresh.block)
    assert_same_training(ref, fresh, _x())


def test_find_fuse_and_replace_on_a_dynamo_graph():
    ref, model = _pair()
    sch = slapo.create_schedule(model)
    sch["block"].trace(example_inputs=_x(), tracer="dynamo")
    block = sch["block"]
    # a pattern function matches ATen operations: x + b then gelu
    hits = block.find(lambda x, b: F.gelu(x + b))
    assert len(hits) == 1 and [n.target.__name__ for n in hits[0].nodes] == [
        "add.Tensor", "gelu.default"]
    name = block.fuse(hits[0], compiler="aot_eager", name="BiasGeLU")
    assert name == "BiasGeLU_0"
    # the operations of one module, by the module stack torch.export records
    (linear,) = block.find(where=from_module("fc2"))
    assert linear.output.target is torch.ops.aten.linear.default
    block.replace(lambda x, w, b: F.linear(x, w, b), linear)
    # recompute the element-wise scaling in backward
    (scaled,) = block.find(lambda x: x * 2.0)
    block.checkpoint(scaled)
    assert not any(n.target is torch.ops.aten.linear.default and n in linear.nodes
                   for n in sch["block"].mod.graph.nodes)
    assert_same_training(ref, model, _x())
    assert_same_training(ref, model, _x(3, 5))
    assert list(model.state_dict()) == list(ref.state_dict())  # also after compiling
    # a regex on module names cannot match a flat graph: the error says what to use
    with pytest.raises(PatternError, match=r"tracer='dynamo'.*Hint: .*from_module\('fc1'\)"):
        block.find("fc1")


def test_dynamo_refusals_say_what_to_do():
    _, model = _pair()
    sch = slapo.create_schedule(model)
    sch["block.fc1"].sync("fwd_post", lambda mod, args, out: out)
    with pytest.raises(TraceError, match=r"fc1 carries hooks.*Hint: trace with "
                       r"tracer='dynamo' before"):
        sch["block"].trace(example_inputs=_x(), tracer="dynamo")
    with pytest.raises(TraceError, match="leaves=, flatten= and recursive= are options"):
        sch["head"].trace(example_inputs=_x(), tracer="dynamo", flatten=True)
    with pytest.raises(TraceError, match=r"unknown tracer 'pytorch'.*Hint: tracer='fx'"):
        sch["block"].trace(example_inputs=_x(), tracer="pytorch")
    # dropout's training flag is an argument that differs between the modes: the graph reads
    # self.training on every call, exact in both modes (issue #39)
    ref, model = _pair(p=0.5)
    sch = slapo.create_schedule(model)
    sch["block"].trace(example_inputs=_x(), tracer="dynamo")
    for training in (True, False, True):
        ref.train(training)
        model.train(training)
        assert_same_training(ref, model, _x(3, 5))
    # operations that exist in one mode only: the other mode is refused in one line
    model = ModeBranch()
    sch = slapo.create_schedule(model)
    sch["inner"].trace(example_inputs=_x(), tracer="dynamo")
    model(*_x())
    model.eval()
    with pytest.raises(TraceError, match=r"traced in train mode.*runs in eval mode") as e:
        model(*_x())
    assert "\n" not in str(e.value)


class Inner(nn.Module):
    def forward(self, x):
        return x.sin() if self.training else x.cos()


class ModeBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x)


def _tensor_parallel_dynamo():
    """fc1 column- and fc2 row-sharded inside the block, the block traced with dynamo, the
    block's input gradient and output all-reduced on the traced module."""
    n = dist.get_world_size()
    ref, model = _pair(bias=False)
    sch = slapo.create_schedule(model)
    sch["block.fc1"].shard(["weight", "bias"], axis=0)
    sch["block.fc2"].shard("weight", axis=1)
    gm = sch["block"].trace(example_inputs=_x(), tracer="dynamo")
    assert isinstance(gm, fx.GraphModule) and is_dynamo_graph(gm)
    sch["block"].sync("both", "all_reduce")
    train_and_compare(ref, model, _x(), steps=2)
    train_and_compare(ref, model, _x(3, 5), steps=1)
    return n


@pytest.mark.parametrize("world_size", [1, 2])
def test_dynamo_graph_with_tensor_parallel_shards(world_size):
    assert run_distributed(_tensor_parallel_dynamo, world_size) == [world_size] * world_size


# ------------------------------------------------ module-aware patterns on a flat graph
_SELF = "bert.encoder.layer.0.attention.self"


def _qkv_pattern(x):
    """The original Slapo's dynamo test pattern (its dynamo named the modules ``self_query``)."""
    return slapo.call_module(r"self_(query|key|value)", x)


def _qkv_heads_pattern(x):
    x = slapo.call_module(r"(query|key|value)", x)
    return x.view((2, 8, 2, 16)).transpose(1, 2)


class FusedQKV(nn.Module):
    """The three projections as one matmul on their concatenated weights (the same Parameter
    objects, so gradients and state_dict keys stay those of the original)."""

    def __init__(self, owner: nn.Module):
        super().__init__()
        names = ("query", "key", "value")
        self.weights = nn.ParameterList(owner.get_parameter(f"{n}.weight") for n in names)
        self.biases = nn.ParameterList(owner.get_parameter(f"{n}.bias") for n in names)

    def forward(self, x):
        out = F.linear(x, torch.cat(list(self.weights)), torch.cat(list(self.biases)))
        return out.chunk(3, dim=-1)


def _bert_self_dynamo(seed: int = 0):
    from slapo.testing import example_inputs, tiny_model

    ref, model = tiny_model("bert", seed=seed), tiny_model("bert", seed=seed)
    inputs = example_inputs("bert")
    sch = slapo.create_schedule(model)
    sch[_SELF].trace(example_inputs=inputs, tracer="dynamo")
    return ref, model, sch, inputs


def _qkv_on_dynamo():
    """The original's pattern finds q, k, v on the flat graph, a horizontal replace of the
    matches trains like the model, and the same pattern finds them with the default tracer."""
    from slapo.testing import example_inputs, tiny_model

    ref, model, sch, inputs = _bert_self_dynamo()
    sub = sch[_SELF]
    hits = sub.find(_qkv_pattern)
    assert [[n.name for n in h.nodes] for h in hits] == [
        [f"{p}_weight", f"{p}_bias", f"linear{s}"]
        for p, s in (("query", ""), ("key", "_1"), ("value", "_2"))]
    assert all([i.name for i in h.inputs] == ["hidden_states"] for h in hits)
    assert len(sub.find(lambda x: slapo.call_module("(query|key|value)", x))) == 3
    sub.replace(FusedQKV(sub.mod), hits)
    assert not any(n.target is torch.ops.aten.linear.default for n in sub.mod.graph.nodes)
    names = [n for n, _ in model.named_parameters()]
    assert names == [n for n, _ in ref.named_parameters()]  # shared, not new, parameters
    train_and_compare(ref, model, inputs, steps=2)
    # the default tracer: the same pattern, on call_module nodes
    fx_model = tiny_model("bert")
    fx_sch = slapo.create_schedule(fx_model)
    fx_sch[_SELF].trace(example_inputs=example_inputs("bert"))
    assert len(fx_sch[_SELF].find(lambda x: slapo.call_module("(query|key|value)", x))) == 3
    return dist.get_world_size()


@pytest.mark.parametrize("world_size", [1, 2])
def test_call_module_pattern_on_a_dynamo_graph(world_size):
    assert run_distributed(_qkv_on_dynamo, world_size) == [world_size] * world_size


def test_call_module_matches_checkpoint_and_fuse_on_a_dynamo_graph():
    ref, model, sch, inputs = _bert_self_dynamo()
    sub = sch[_SELF]
    hits = sub.find(_qkv_heads_pattern)  # projection, view, transpose of each of q, k, v
    assert [len(h.nodes) for h in hits] == [5, 5, 5]
    assert [h.output.target for h in hits] == [torch.ops.aten.transpose.int] * 3
    # a module whose path does not match: the error names the modules that ran
    with pytest.raises(PatternError, match=r"no match.*modules that ran here.*key, query, "
                       r"value"):
        sub.find(lambda x: slapo.call_module("nope", x))
    # the pattern's arguments are the call's inputs; parameters stay inside the match
    with pytest.raises(PatternError, match="no match"):
        sub.find(lambda x, w: slapo.call_module("query", x, w))
    # each projection with its parameters: checkpoint one, compile another, replace the third
    query, key, value = sub.find(lambda x: slapo.call_module("(query|key|value)", x))
    sub.checkpoint(query)
    sub.fuse(key, compiler="aot_eager", name="KeyProjection")
    sub.replace(lambda x: F.linear(x, sub.mod.get_parameter("value.weight"),
                                   sub.mod.get_parameter("value.bias")), value)
    assert any(n.op == "call_module" and n.target.startswith("KeyProjection")
               for n in sub.mod.graph.nodes)
    train_and_compare(ref, model, inputs, steps=2)


def test_a_call_module_match_replays_on_a_fresh_model():
    from slapo.testing import tiny_model

    ref, model, sch, inputs = _bert_self_dynamo()
    sub = sch[_SELF]
    sub.checkpoint(sub.find(_qkv_pattern)[1])  # the key projection, recomputed in backward
    fresh = tiny_model("bert")
    sch.history.replay(fresh)
    graph = fresh.get_submodule(_SELF).graph
    assert is_dynamo_graph(fresh.get_submodule(_SELF))
    assert [n.target for n in graph.nodes if n.op == "call_module" and n.target != "_guards_fn"
            ] == [n.target for n in sub.mod.graph.nodes
                  if n.op == "call_module" and n.target != "_guards_fn"] != []
    train_and_compare(ref, fresh, inputs, steps=1)
    train_and_compare(tiny_model("bert"), model, inputs, steps=1)


def test_none_extras_of_kwargs_are_left_out_and_refused_when_given():
    """HF's BertSelfAttention takes ``**kwargs``; the parent passes ``encoder_hidden_states=None``
    and ``position_ids=None`` through them, which torch.export cannot line up with dynamic shapes:
    they are left out of the graph, dropped from later calls, and refused when not None."""
    _, model, sch, inputs = _bert_self_dynamo()
    gm = sch[_SELF].mod
    hidden = torch.randn(2, 8, 32)
    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool)  # the dtype of the trace's mask
    out = gm(hidden, attention_mask=mask, cache=None, encoder_hidden_states=None)
    torch.testing.assert_close(out[0], gm(hidden, attention_mask=mask, cache=None)[0])
    with pytest.raises(TraceError, match=r"encoder_hidden_states were None when this dynamo "
                       r"graph was traced.*Hint: trace with example inputs that pass them"):
        gm(hidden, attention_mask=mask, cache=None, encoder_hidden_states=hidden)
