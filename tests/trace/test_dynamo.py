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
    # dropout is fixed in the traced mode: running in the other mode is an error
    _, model = _pair(p=0.5)
    sch = slapo.create_schedule(model)
    sch["block"].trace(example_inputs=_x(), tracer="dynamo")
    model(*_x())
    model.eval()
    with pytest.raises(TraceError, match="traced in train mode.*runs in eval mode"):
        model(*_x())


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
