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
validates each call against them and :func:`check_layouts` lists missing reductions.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Set

__all__ = [
    "Layout", "REPLICATED", "PARTIAL", "partition", "ModuleLayout", "ShardInfo", "SyncRecord",
    "LayoutProblem", "shard_info", "sync_records", "current_output", "check_layouts",
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


def _reduces_output(rec: SyncRecord) -> bool:
    return rec.mode == "fwd_post" and (rec.user_fn or rec.op in ("all_reduce", "reduce_scatter"))


def _reduces_input_grad(rec: SyncRecord) -> bool:
    if rec.mode == "bwd_post" and (rec.user_fn or rec.op == "all_reduce"):
        return True
    return rec.op == "all_gather" and bool(rec.tensor_parallel_output_grad)


def check_layouts(sch) -> List[LayoutProblem]:
    """Layout problems of the whole schedule tree of ``sch`` (empty list = none found).

    Reported: (1) a module whose output is *partial* and that no fwd_post reduction (all_reduce,
    reduce_scatter or a user function) on it or an enclosing module sums -- each rank would
    continue with a wrong partial value; (2) such a module with a bias whose reduction is only on
    an enclosing module -- the bias would be added ``world_size`` times; (3) a column-parallel
    module whose partial input gradient is reduced nowhere (no ``bwd_post`` all_reduce on it or an
    enclosing module, and no ``all_gather`` with ``tensor_parallel_output_grad=True`` anywhere,
    which reduce-scatters gradients); (4) incomplete shards reported by the module's shard rule
    (e.g. a column-sharded Linear whose bias was left whole).

    Check (3) cannot follow dataflow, so any gradient-reducing all_gather counts as covering it.
    """
    from .rules import rule_for  # rules import layout

    problems: List[LayoutProblem] = []
    root = sch.root
    nodes = list(root.named_schedules())
    grad_gather_anywhere = any(
        r.op == "all_gather" and r.tensor_parallel_output_grad for _, n in nodes
        for r in sync_records(n))
    for path, node in nodes:
        info = shard_info(node)
        if info is None:
            continue
        chain = [node]
        while chain[-1].parent is not None:
            chain.append(chain[-1].parent)
        problems += [LayoutProblem(path, what, hint)
                     for what, hint in rule_for(node.mod).problems(node.mod, info)]
        if info.layout is None:
            continue
        own = sync_records(node)
        if info.layout.output == PARTIAL and not any(_reduces_output(r) for r in own):
            outer = [n for n in chain[1:] if any(_reduces_output(r) for r in sync_records(n))]
            if not outer:
                problems.append(LayoutProblem(
                    path, "its output is a partial sum that is never reduced",
                    f"add sch['{path}'].sync('fwd_post', 'all_reduce') (or 'reduce_scatter' for "
                    "sequence parallelism)"))
            elif getattr(node.mod, "bias", None) is not None:
                problems.append(LayoutProblem(
                    path, f"its partial output is reduced only by '{outer[0].path}', after its "
                    "bias was added on every rank (the bias is counted world_size times)",
                    f"sync on '{path}' itself, so the bias is added after the reduction"))
        if info.layout.input_grad_partial and not grad_gather_anywhere and not any(
                _reduces_input_grad(r) for n in chain for r in sync_records(n)):
            problems.append(LayoutProblem(
                path, "the gradient of its input is a partial sum that is never all-reduced",
                f"add sch['{path}'].sync('bwd_post', 'all_reduce') (or on the module that "
                "encloses this tensor-parallel region)"))
    return problems
