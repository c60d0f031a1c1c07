"""Applying a resolved plan: every entry through its style, then the report of what stays whole.

:func:`check_plan` makes every check (:mod:`.checks`, each style's own ``check``) before
anything changes; :func:`apply_plan` runs it, then applies the dense entries in module order
(:data:`.styles.STYLES`), reduces the input gradient of grouped column projections once on their
parent, covers unnamed parameters inside tensor-parallel regions, then shards the experts
modules with the entries below them as their plan. :func:`report_unsharded` warns about the
modules whose parameters the plan leaves whole.
"""

from __future__ import annotations

import warnings
from typing import Dict, List, Sequence, Set, Tuple

from ...schedule import Schedule
from .. import common as C
from ..config import ScheduleConfig
from .checks import (check_heads, check_styles, cover_regions, group_columns, is_sharded,
                     region_params)
from .plan import PlanEntry
from .styles import EXPERTS_STYLE, STYLES, PlanContext

__all__ = ["check_plan", "apply_plan", "unsharded_modules", "report_unsharded"]


def _experts_plan(entries: Sequence[PlanEntry]) -> Tuple[List[PlanEntry],
                                                         Dict[str, Dict[str, str]],
                                                         List[PlanEntry]]:
    """Split off the mixture-of-experts part: the experts entries (one per module), experts
    path -> its sub-plan (names relative to it), and the dense entries."""
    owners: Dict[str, PlanEntry] = {}
    for e in entries:
        if e.style == EXPERTS_STYLE and e.param is None:
            owners.setdefault(e.path, e)
    experts: Dict[str, Dict[str, str]] = {path: {} for path in owners}
    dense = []
    for e in entries:
        owner = next((p for p in experts if e.target.startswith(p + ".")), None)
        if owner is not None:
            experts[owner][e.target[len(owner) + 1:]] = e.style
        elif e.style != EXPERTS_STYLE:
            dense.append(e)
    return list(owners.values()), experts, dense


def check_plan(sch: Schedule, entries: Sequence[PlanEntry], cfg: ScheduleConfig,
               mode: C.TPMode, *, expert_parallel: bool = False) -> PlanContext:
    """Every check :func:`apply_plan` makes, without changing anything; returns the context
    the application then uses.

    Raises:
        ConfigError: a refused or unknown style, heads the TP size does not divide, an entry
            whose module does not fit its style, unnamed parameters inside a tensor-parallel
            region, experts or routers that cannot be sharded (all naming the module).
    """
    ctx = PlanContext(sch, cfg, mode, expert_parallel=expert_parallel)
    check_styles(entries)
    if not mode.tp:
        return ctx
    owners, ctx.experts, dense = _experts_plan(entries)
    ctx.dense_paths = {e.path for e in dense}
    check_heads(sch, dense)
    for entry in [*dense, *owners]:
        STYLES[entry.style].check(ctx, entry)
    region_params(sch, dense)
    return ctx


def apply_plan(sch: Schedule, entries: Sequence[PlanEntry], cfg: ScheduleConfig,
               mode: C.TPMode, *, expert_parallel: bool = False) -> PlanContext:
    """Apply resolved plan ``entries`` with Slapo primitives (nothing without TP); returns
    what was done (:class:`PlanContext`). Checks every entry before changing anything
    (:func:`check_plan`).

    Raises:
        ConfigError: as :func:`check_plan`.
    """
    ctx = check_plan(sch, entries, cfg, mode, expert_parallel=expert_parallel)
    if not mode.tp:
        return ctx
    owners, _, dense = _experts_plan(entries)
    groups = group_columns(sch, dense)
    ctx.grouped = {p for paths in groups.values() for p in paths}
    for entry in dense:
        style = STYLES[entry.style]
        style.apply(ctx, entry)
        if style.keeps_whole:
            ctx.handled.add(entry.path)
    for parent in groups:
        if not mode.sp:
            sch[parent].sync("bwd_post", "all_reduce")
    cover_regions(ctx, dense)
    for entry in owners:
        STYLES[entry.style].apply(ctx, entry)
    return ctx


def unsharded_modules(sch: Schedule, handled: Set[str]) -> List[str]:
    """Modules holding parameters of their own, none of them sharded, that no plan entry
    handled (as globs over layer indices, e.g. ``model.layers.*.input_layernorm``)."""
    found: List[str] = []
    for path, mod in sch.mod.named_modules():
        if not any(True for _ in mod.parameters(recurse=False)) or is_sharded(mod):
            continue
        if path in handled or any(path.startswith(h + ".") for h in handled):
            continue
        glob = ".".join("*" if part.isdigit() else part for part in path.split("."))
        if glob not in found:
            found.append(glob)
    return found


def report_unsharded(sch: Schedule, handled: Set[str]) -> List[str]:
    """Warn about (and record in ``sch.metadata["tp_plan_unsharded"]``) the modules whose
    parameters stay whole on every rank (:func:`unsharded_modules`)."""
    if sch.world_size == 1:
        return []  # nothing is sharded on one rank
    found = unsharded_modules(sch, handled)
    sch.metadata["tp_plan_unsharded"] = found
    if found:
        warnings.warn(f"the tensor-parallel plan leaves the parameters of {len(found)} module "
                      f"group(s) whole on every rank: {', '.join(found)}", stacklevel=3)
    return found
