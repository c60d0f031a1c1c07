"""Pipelines whose stages pass ints and shapes (GPT-2's ``output_shape``) in simulation: the
unpacking nodes of a stage know the packed values that fake receive buffers do not carry
(end2end/simulate/engine/pipeline_values.py), and a GPT-2 pipeline simulates every stage, its FLOPs
and
parameters adding up to the unpipelined model's."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import fx
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensorMode

from end2end.simulate.engine.pipeline_values import KnownPackedValues, remember_packed_values
from end2end.simulate.engine.recorder import StepRecorder
from end2end.spec.config_file import make_run_spec

from slapo.pipeline.values import RebuildTree, crossing, pack_value, unpack_value


def _stage_viewing_as_received_shape() -> fx.GraphModule:
    """A stage's graph as slapo.pipeline.stages builds it: ``x.view(unpack_value(shape))``."""
    g = fx.Graph()
    x, shape = g.placeholder("x"), g.placeholder("output_shape")
    g.output(g.call_method("view", (x, g.call_function(unpack_value, (shape, "size")))))
    return fx.GraphModule(torch.nn.Module(), g)


def _stage_rebuilding_a_tree(how) -> fx.GraphModule:
    """A stage rebuilding ``(hidden, (rows, cols))`` sent as three tensors, viewing by it."""
    g = fx.Graph()
    sent = [g.placeholder(f"t{i}") for i in range(how.num_tensors)]
    value = g.call_function(RebuildTree("pair", how), tuple(sent))
    hidden, shape = (g.call_function(operator.getitem, (value, i)) for i in (0, 1))
    g.output(g.call_method("view", (hidden, shape)))
    return fx.GraphModule(torch.nn.Module(), g)


@pytest.fixture
def fake(monkeypatch):
    # as end2end.simulate.engine.fake_world: small tensors made from Python data keep their values
    monkeypatch.setattr(fake_tensor, "CONSTANT_NUMEL_LIMIT", 64)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        yield mode


def test_a_received_shape_without_value_reads_as_ones_unless_remembered(fake):
    with StepRecorder():  # the simulator's recorder: unknown scalars read as 1
        x, buffer = torch.empty(3, 8), torch.empty(2, dtype=torch.long)
        plain = _stage_viewing_as_received_shape()
        with pytest.raises(RuntimeError, match=r"shape '\[1, 1\]' is invalid"):
            plain(x, buffer)  # the failure GPT-2's last stage had
        stage = _stage_viewing_as_received_shape()
        assert remember_packed_values(stage) == 1
        assert stage(x, pack_value((2, 12))).shape == (2, 12)  # the in-process first pass
        assert stage(x, buffer).shape == (2, 12)  # a receive buffer: the value seen before
        assert stage(x, torch.tensor([4, 6])).shape == (4, 6)  # a value: used as it is


def test_a_rebuilt_tree_gets_its_packed_leaves_and_keeps_its_tensors(fake):
    how = crossing((torch.zeros(3, 8), (4, 6)))
    assert how.leaves == ("tensor", "int", "int")
    stage = _stage_rebuilding_a_tree(how)
    assert remember_packed_values(stage) == 1
    hidden = torch.empty(3, 8)
    unknown = torch.empty(1, dtype=torch.long)
    with StepRecorder():
        assert stage(hidden, pack_value(2), pack_value(12)).shape == (2, 12)
        assert stage(torch.empty(3, 8), unknown, unknown).shape == (2, 12)
        with pytest.raises(RuntimeError, match="shape '.*' is invalid"):
            stage(torch.empty(5, 5), unknown, unknown)  # the tensor leaf is not replaced


def test_a_value_never_seen_is_a_clear_error(fake):
    unpack = KnownPackedValues(unpack_value, [0], "output_shape")
    with pytest.raises(RuntimeError, match="'output_shape' arrived packed .* never saw it"):
        unpack(torch.empty(3, dtype=torch.long), "size")


def test_only_pipeline_stage_graphs_are_rewritten():
    assert remember_packed_values(torch.nn.Linear(2, 2)) == 0
    g = fx.Graph()
    g.output(g.call_function(torch.relu, (g.placeholder("x"),)))
    assert remember_packed_values(fx.GraphModule(torch.nn.Module(), g)) == 0


# ---------------------------------------------------------------- a GPT-2 pipeline simulated

def _gpt2(n: int, **kw):
    return make_run_spec("slapo", "tiny/gpt2", n, 32, 0, 4, "0", steps=1, warmup=0,
                         dtype="fp32", **kw)


def test_gpt2_pipeline_simulates_every_stage_and_adds_up_to_the_whole():
    """tiny/gpt2, 2 stages on 2 fake ranks, 2 micro-batches of 2, against the same model and
    batch unpipelined on 1 rank: every stage simulated, forward and backward FLOPs summing to
    the whole's, parameters summing to the whole's plus the embedding tied to the last stage's
    head (each stage keeps a copy)."""
    from end2end.models import build_model
    from end2end.simulate.engine.run import simulate_run

    pipe = simulate_run(_gpt2(2, pp=2, micro_batch=2), "v100-32gb", timeout=300)
    whole = simulate_run(_gpt2(1), "v100-32gb", timeout=300)
    assert pipe["status"] == "sim", pipe.get("error")
    assert whole["status"] == "sim", whole.get("error")
    assert pipe["extra"]["roles"] == [0, 1]
    stages, total = pipe["extra"]["totals"], whole["extra"]["totals"][0]
    for phase in ("forward", "backward"):
        per_stage = [t[f"flops_{phase}"] for t in stages]
        assert min(per_stage) > 0, per_stage
        assert sum(per_stage) == pytest.approx(total[f"flops_{phase}"], rel=0.01), phase
    assert all(t.get("comm_p2p_bytes", 0) > 0 for t in stages)  # activations and gradients
    tied = build_model("tiny/gpt2", device="meta").get_input_embeddings().weight.numel() * 4
    param_bytes = [m["param"] for m in pipe["extra"]["memory"]]
    assert sum(param_bytes) == whole["extra"]["memory"][0]["param"] + tied, param_bytes
