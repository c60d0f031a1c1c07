"""Activation layouts of sharded modules, and the records ``shard``/``sync`` keep about them.

A tensor-parallel activation is in one of three layouts:

* ``replicated`` -- every rank holds the whole tensor;
* ``partition(axis)`` -- every rank holds an equal chunk along ``axis`` (a *negative* axis,
  counted from the end, so that it means the same for 2-D and 3-D activations: ``-1`` is the
  feature axis of a Linear output, ``-3`` the channel axis of an NCHW activation);
* ``partial`` -- every rank holds a full-shaped tensor and the true value is their sum.

``shard`` records, per module, the layout its input must have, the layout of its output and
whether the gradient of its input is partial (:class:`ModuleLayout`), in
``sch.metadata["shard"]`` (a :class:`ShardInfo`). ``sync`` appends :class:`SyncRecord` s to
``sch.metadata["sync"]``; the *current* output layout is the recorded one transformed by those
syncs (:func:`current_output`). These records make the layout rules checkable: ``sync``
validates each call against them and :func:`~slapo.sharding.layout_check.check_layouts` lists
missing reductions.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Set

__all__ = [
    "Layout", "REPLICATED", "PARTIAL", "partition", "ModuleLayout", "ShardInfo", "SyncRecord",
    "LayoutProblem", "shard_info", "sync_records", "current_output",
]


@dataclasses.dataclass(frozen=True)
class Layout:
    """``kind`` is ``"replicated"``, ``"partition"`` (with a negative ``axis``) or ``"partial"``."""

    kind: str
    axis: Optional[int] = None

    def __str__(self) -> str:
        return f"partition(axis={self.axis})" if self.kind == "partition" else self.kind


REPLICATED = Layout("replicated")
PARTIAL = Layout("partial")


def partition(axis: int) -> Layout:
    """Partitioned along ``axis`` (must be negative: counted from the last axis)."""
    assert axis < 0, axis
    return Layout("partition", axis)


@dataclasses.dataclass(frozen=True)
class ModuleLayout:
    """What a sharded module expects and produces.

    ``input``: the layout its (first) input must have; ``output``: the layout of its output;
    ``input_grad_partial``: the gradient w.r.t. its input is a partial sum on each rank (a
    column-parallel module: it needs an all-reduce in backward before reaching replicated
    parameters).
    """

    input: Layout
    output: Layout
    input_grad_partial: bool = False


@dataclasses.dataclass
class ShardInfo:
    """``sch.metadata["shard"]``: tensor name -> sharded tensor axis, and the module layout
    inferred by the module's shard rule (``None`` when the rule does not know it). ``named``
    holds the tensors a ``shard`` call named on this module (the others were sharded through a
    tied partner); ``fused`` is the ``fused=`` of the call."""

    tensors: Dict[str, int] = dataclasses.field(default_factory=dict)
    layout: Optional[ModuleLayout] = None
    fused: int = 1
    named: Set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass(frozen=True)
class SyncRecord:
    """One ``sync`` call: ``op`` is a string op name or ``"<fn name>"`` for a user function;
    ``from_axis`` is the partition axis an ``all_to_all`` moves away from (to ``axis``)."""

    mode: str
    op: str
    axis: Optional[int] = None
    tensor_parallel_output_grad: Optional[bool] = None
    user_fn: bool = False
    from_axis: Optional[int] = None


def shard_info(sch) -> Optional[ShardInfo]:
    """The :class:`ShardInfo` of a schedule node, if its module was sharded."""
    return sch.metadata.get("shard")


def sync_records(sch) -> List[SyncRecord]:
    """The syncs applied to a schedule node, in order."""
    return list(sch.metadata.get("sync", []))


def after_op(layout: Layout, op: str, axis: Optional[int]) -> Layout:
    """The layout produced by string sync ``op`` from ``layout`` (validity checked elsewhere)."""
    if op in ("all_reduce", "all_gather"):
        return REPLICATED
    if op in ("reduce_scatter", "scatter", "all_to_all"):
        return Layout("partition", axis)
    return layout


def current_output(sch) -> Optional[Layout]:
    """The output layout of a node after its fwd_post syncs (``None`` if unknown)."""
    info = shard_info(sch)
    if info is None or info.layout is None:
        return None
    layout = info.layout.output
    for rec in sync_records(sch):
        if rec.mode == "fwd_post":
            if rec.user_fn:
                return None
            layout = after_op(layout, rec.op, rec.axis)
    return layout


@dataclasses.dataclass(frozen=True)
class LayoutProblem:
    """A layout rule a schedule breaks: ``path``, ``what`` is wrong, and a ``hint``."""

    path: str
    what: str
    hint: str

    def __str__(self) -> str:
        return f"'{self.path or '<root>'}': {self.what}. Hint: {self.hint}"
