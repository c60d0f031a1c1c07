"""The layout check of a whole schedule tree: missing reductions of partial outputs and input
gradients, biases added before their reduction, incomplete shards (the records it reads are in
:mod:`slapo.sharding.layout`; the per-class shard rules in :mod:`slapo.sharding.rules`)."""

from __future__ import annotations

from typing import List

from .layout import PARTIAL, LayoutProblem, SyncRecord, shard_info, sync_records
from .rules import rule_for

__all__ = ["check_layouts"]


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
