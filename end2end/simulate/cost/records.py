"""What the cost model prices: one kernel (:class:`OpRecord`) and one collective
(:class:`CollectiveRecord`) of a simulated step, and their totals (:func:`work_totals`). The
engine's recorder (:mod:`end2end.simulate.engine.recorder`) makes them; the time model
(:mod:`end2end.simulate.cost.timing`) prices them.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

__all__ = ["OpRecord", "CollectiveRecord", "work_totals"]


@dataclasses.dataclass(frozen=True)
class OpRecord:
    """One kernel: FLOPs, bytes read + written, dtype name, phase; ``weight``: how many times it
    counts (1 as recorded; micro-batch extrapolation, :mod:`end2end.simulate.engine.microbatches`,
    weighs whole recorded steps); ``shape``: a GEMM's ``(batch, M, N, K)`` for the GPU
    profiles' tile and wave model (:mod:`end2end.simulate.cost.gpu_model`)."""

    flops: int
    bytes: int
    dtype: str
    phase: str
    weight: float = 1.0
    name: str = ""  # the ATen op (overload packet), e.g. "addmm", "_softmax"
    view: bool = False  # a view (moves nothing; eager PyTorch still dispatches it)
    shape: Tuple[int, ...] = ()  # a GEMM's (batch, M, N, K) (:mod:`~.gpu_model`); else ()


@dataclasses.dataclass(frozen=True)
class CollectiveRecord:
    """One collective: kind (``allreduce``, ``allgather``, ...), bytes of this rank's tensor,
    the group's size and global ranks, phase; ``weight`` as for :class:`OpRecord`; ``exposed``:
    on the critical path even where the runtime overlaps its kind."""

    kind: str
    bytes: int
    group_size: int
    ranks: Tuple[int, ...]
    phase: str
    weight: float = 1.0
    exposed: bool = False  # never overlapped with compute (e.g. ZeRO-3's first gather of a pass)


def work_totals(ops, collectives) -> Dict[str, float]:
    """FLOPs and bytes per phase, collectives' bytes and calls per kind, weights applied."""
    out: Dict[str, float] = {}
    for op in ops:
        out[f"flops_{op.phase}"] = out.get(f"flops_{op.phase}", 0) + op.flops * op.weight
        out[f"bytes_{op.phase}"] = out.get(f"bytes_{op.phase}", 0) + op.bytes * op.weight
    for c in collectives:
        out[f"comm_{c.kind}_bytes"] = out.get(f"comm_{c.kind}_bytes", 0) + c.bytes * c.weight
        out[f"comm_{c.kind}_calls"] = out.get(f"comm_{c.kind}_calls", 0) + c.weight
    return out
