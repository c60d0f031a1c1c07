"""Micro-batch extrapolation of a step's work and peak memory from two recorded steps
(end2end/simulate/engine/microbatches.py), on synthetic records."""

from __future__ import annotations

import pytest

from end2end.simulate.engine.microbatches import extrapolate
from end2end.simulate.cost.records import OpRecord
from end2end.simulate.engine.step import RankResult

GB = 10**9


def _step(micro: int, peak: int) -> RankResult:
    """A stage's step with ``micro`` micro-batches: 10 forward FLOPs each, one optimizer op."""
    ops = [OpRecord(10, 4, "float32", "forward") for _ in range(micro)]
    ops.append(OpRecord(0, 8, "float32", "optimizer"))
    memory = dict(param=10 * GB, buffer=0, grad=10 * GB, optstate=60 * GB, peak=peak)
    return RankResult(0, ops, [], memory, 5 * 10**9)


def test_work_follows_the_line_and_the_optimizer_stays_once():
    out = extrapolate(_step(2, 100 * GB), _step(3, 110 * GB), 8, 8)
    assert out.totals["flops_forward"] == pytest.approx(80)
    assert out.totals["bytes_optimizer"] == pytest.approx(8)
    assert out.memory["peak"] == 100 * GB + 6 * 10 * GB  # GPipe: 8 micro-batches in flight
    assert out.memory["activation"] == out.memory["peak"] - 80 * GB
    assert out.extrapolated == dict(microbatches=8, simulated=[2, 3], in_flight=8)


def test_a_stage_holding_one_micro_batch_keeps_at_least_its_states():
    """1F1B's last stage holds one micro-batch (fewer than the two simulated): the line goes
    below peak(2), but never below the parameters, gradients and optimizer states it holds
    (GPT-10B's second stage of a 2-stage DeepSpeed pipeline: 73.9 GB predicted, 80.6 GB of
    states, before this floor)."""
    out = extrapolate(_step(2, 92 * GB), _step(3, 110 * GB), 8, 1)
    assert out.memory["peak"] == 80 * GB
    assert out.memory["activation"] == 0
    out = extrapolate(_step(2, 120 * GB), _step(3, 130 * GB), 8, 1)
    assert out.memory["peak"] == 110 * GB  # above the states: the line itself
