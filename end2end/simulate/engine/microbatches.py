"""Runs with many micro-batches (pipelines, gradient accumulation): two short steps, extrapolated.

A pipeline stage or a megatron rank steps its micro-batches one after another, each doing the
same work on tensors of the same shapes. Stepping all of them (Figure 8: 32-64 per stage) costs
minutes per stage on fake tensors and tells nothing new, so a run with ``M`` > 3 micro-batches is
simulated twice per role, with 2 and with 3 micro-batches of the real size (the same model,
schedule, stage cuts and runtime; only the rank's batch is shorter), and what an ``M``-micro-batch
step does follows linearly: every quantity ``X(M) = X(2) + (M - 2) (X(3) - X(2))``. (Not 1 and
2: with one micro-batch the step's peak can fall elsewhere, e.g. in the optimizer step, and the
line through 1 and 2 misses the growth; from 2 on it is linear, tests/end2end/simulate.)

* Work (kernels, collectives: their time, FLOPs, bytes, calls): exactly that line, by weighing
  the two recorded steps ``3 - M`` and ``M - 2`` (:attr:`OpRecord.weight`); what runs once per
  step (the optimizer, the data-parallel gradient reduction) cancels out to once.
* Peak memory: ``peak(2) + (F - 2) (peak(3) - peak(2))``, at least the states held after the
  step (parameters, gradients, optimizer states), with ``F`` the micro-batches whose
  activations are alive at once: all ``M`` in Slapo's torch pipeline (GPipe: every forward, then
  every backward), ``min(M, P - s)`` on stage ``s`` of a DeepSpeed pipeline (1F1B), and for
  gradient accumulation (any mode without a pipeline) the measured growth (about nothing: a
  micro-batch's activations are freed by its backward) times ``M - 2``.

Runs with at most 3 micro-batches are simulated as they are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from end2end.simulate.engine.step import RankResult, simulate_rank, simulate_rank_isolated

__all__ = ["simulate_role", "extrapolate", "in_flight"]


def in_flight(spec, layout, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once (module docstring)."""
    m = layout.num_microbatches
    if layout.pp > 1 and spec.framework == "deepspeed":
        return min(m, layout.pp - stage)
    return m


FIRST = 2  # the shorter of the two simulated steps has FIRST micro-batches, the other FIRST + 1


def extrapolate(one: RankResult, two: RankResult, m: int, held: int) -> RankResult:
    """The ``m``-micro-batch step from the ``FIRST``- and ``FIRST + 1``-micro-batch ones (module
    docstring)."""
    w_one, w_two = FIRST + 1 - m, m - FIRST
    ops = [dataclasses.replace(op, weight=op.weight * w_one) for op in one.ops] + \
        [dataclasses.replace(op, weight=op.weight * w_two) for op in two.ops]
    comms = [dataclasses.replace(c, weight=c.weight * w_one) for c in one.collectives] + \
        [dataclasses.replace(c, weight=c.weight * w_two) for c in two.collectives]
    memory = dict(two.memory)
    growth = two.memory["peak"] - one.memory["peak"]
    states = sum(memory.get(k, 0) for k in ("param", "buffer", "grad", "optstate", "working"))
    # never below the states held after the step (a 1F1B stage with fewer micro-batches in
    # flight than FIRST extrapolates downwards, past a peak that may sit in the optimizer step)
    memory["peak"] = max(one.memory["peak"] + (held - FIRST) * growth, states)
    memory["activation"] = max(0, memory["peak"] - states)
    memory["per_microbatch"] = growth
    from end2end.simulate.cost.records import work_totals

    return dataclasses.replace(two, ops=ops, collectives=comms, memory=memory,
                               totals=work_totals(ops, comms),
                               extrapolated=dict(microbatches=m,
                                                 simulated=[FIRST, FIRST + 1],
                                                 in_flight=held))


def simulate_role(spec, layout, rank: int, gpu: Any = False,
                  isolate: bool = False) -> RankResult:
    """Global rank ``rank``'s step (:func:`~end2end.simulate.engine.step.simulate_rank`), with at
    most
    three micro-batches simulated (module docstring). A process simulates one step only
    (:mod:`end2end.simulate.engine.isolated`): the two short steps, and the step itself when
    ``isolate`` (the run has several roles), run in processes of their own."""
    m = layout.num_microbatches
    if m <= FIRST + 1:
        return (simulate_rank_isolated if isolate else simulate_rank)(spec, layout, rank, gpu)
    one = simulate_rank_isolated(spec, layout.with_microbatches(FIRST), rank, gpu)
    two = simulate_rank_isolated(spec, layout.with_microbatches(FIRST + 1), rank, gpu)
    return extrapolate(one, two, m, in_flight(spec, layout, layout.stage(rank)))
