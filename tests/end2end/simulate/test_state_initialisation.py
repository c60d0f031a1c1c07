"""The recorded step is a training run's first, but a run measures its later (steady) steps: the
optimizer's lazy state initialisation (AdamW's ``zeros_like`` moments and ``torch.tensor(0.0)``
step counts, one set per parameter) is left out of the recorded ops
(``StepRecorder.leave_out_state_initialisation``), and what remains is what a second step runs.
Checked against a second step recorded for real, on fake tensors."""

import collections

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from end2end.simulate.engine.recorder import StepRecorder
from end2end.simulate.engine.step import _optimizer_phase


def _recorded_step(model, optimizer, batch):
    """One step under a recorder with the optimizer phase marked; the recorder."""
    recorder = StepRecorder()
    hooks = _optimizer_phase(recorder)
    try:
        with recorder:
            model(batch).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        for h in hooks:
            h.remove()
    return recorder


def _optimizer_ops(recorder):
    return collections.Counter(op.name for op in recorder.ops if op.phase == "optimizer")


def _states(optimizer):
    return [v for s in optimizer.state.values() for v in s.values()]


# name -> (optimizer, whether its first step creates states); Adagrad creates its sums when
# constructed, so its first step is already a steady one
OPTIMIZERS = {
    "adamw-foreach": (lambda ps: torch.optim.AdamW(ps, foreach=True), True),
    "adamw-loop": (lambda ps: torch.optim.AdamW(ps, foreach=False), True),
    "adam-foreach": (lambda ps: torch.optim.Adam(ps, foreach=True), True),
    "adamw-fused": (lambda ps: torch.optim.AdamW(ps, fused=True), True),
    "adagrad": (lambda ps: torch.optim.Adagrad(ps, foreach=True), False),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_first_step_less_its_state_creation_is_the_second_step(name):
    with FakeTensorMode():
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                    torch.nn.Linear(64, 8))
        make, creates_states = OPTIMIZERS[name]
        optimizer = make(model.parameters())
        batch = torch.randn(4, 32)
        first = _recorded_step(model, optimizer, batch)
        states = _states(optimizer)
        before = collections.Counter(op.name for op in first.ops)
        removed = first.leave_out_state_initialisation(states)
        second = _recorded_step(model, optimizer, batch)
    assert (removed > 0) == creates_states
    assert _optimizer_ops(first) == _optimizer_ops(second)
    # only the optimizer phase lost ops: the forward and backward are untouched
    after = collections.Counter(op.name for op in first.ops)
    lost = before - after
    assert sum(lost.values()) == removed and set(lost) <= {"zeros_like", "lift_fresh", "full_like",
                                                           "zeros"}
    assert [op for op in first.ops if op.phase != "optimizer"] == \
        [op for op in second.ops if op.phase != "optimizer"]


def test_a_state_made_from_data_stays():
    """SGD's momentum buffer starts as a copy of the first gradient (``clone``): that copy stands
    for the update later steps do, so nothing is left out."""
    with FakeTensorMode():
        model = torch.nn.Linear(16, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
        first = _recorded_step(model, optimizer, torch.randn(2, 16))
        ops = list(first.ops)
        assert first.leave_out_state_initialisation(_states(optimizer)) == 0
    assert first.ops == ops and "clone" in _optimizer_ops(first)


def test_states_that_existed_before_the_step_are_not_left_out():
    """Only states new in this step count: with none given, nothing goes."""
    with FakeTensorMode():
        model = torch.nn.Linear(16, 4)
        optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
        first = _recorded_step(model, optimizer, torch.randn(2, 16))
        assert first.leave_out_state_initialisation([]) == 0
    assert _optimizer_ops(first)["zeros_like"] == 4


def simulated_optimizer_phase(mode: str, dtype: str) -> dict:
    """A ``tiny/gpt2`` step of ``mode`` simulated on a V100 profile: the optimizer phase's ops
    by name and the ops left out as first-step-only."""
    from end2end.simulate.engine.step import simulate_rank
    from end2end.spec.config_file import make_run_spec
    from end2end.spec.layout import run_layout

    spec = make_run_spec(mode, "tiny/gpt2", 1, 32, 0, 2, "0", steps=1, warmup=0, dtype=dtype)
    result = simulate_rank(spec, run_layout(spec), 0, gpu=(7, 0))
    names = collections.Counter(op.name for op in result.ops if op.phase == "optimizer")
    return dict(names=dict(names), left_out=result.first_step_only)


@pytest.mark.parametrize("mode, dtype", [("eager", "fp32"), ("megatron", "fp16"),
                                         ("fsdp", "bf16")])
def test_a_simulated_step_has_no_state_creation(mode, dtype):
    """Through the whole simulation (a plain torch AdamW, megatron-core's wrapper of one, FSDP2's
    AdamW over DTensor shards, whose states are DTensors too): the
    step's optimizer phase is a steady step's, a few tensor-list ops, with no per-parameter
    ``zeros_like`` (each priced at the host's floor per op on a GPU profile)."""
    from end2end.simulate.engine.isolated import isolated

    out = isolated("tests.end2end.simulate.test_state_initialisation.simulated_optimizer_phase",
                   mode, dtype)
    assert out["left_out"] > 0, out
    stepped = out["names"].get("_foreach_addcdiv_") or out["names"].get("_fused_adamw_")
    assert "zeros_like" not in out["names"] and stepped, out
