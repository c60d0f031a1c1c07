"""Checks on a resolved plan, made before (or while) it is applied.

* :func:`check_styles`: every entry's style is one Slapo honours (:data:`.styles.REFUSED` and
  unknown styles are refused, naming the entry);
* :func:`check_heads`: column-parallel head projections split into whole heads;
* :func:`group_columns`: column-parallel projections fed one shared input (q/k/v, gate/up),
  whose input gradient one all-reduce on the parent serves (read from the parent's source);
* :func:`region_params` / :func:`cover_regions`: parameters the plan does not name inside a
  tensor-parallel region (found and refused / covered).
"""

from __future__ import annotations

import ast
import fnmatch
import inspect
import textwrap
from typing import Dict, List, Sequence, Set

from torch import nn

from ...errors import ConfigError
from ...schedule import Schedule
from ...sharding.spec import get_shard_spec
from .. import common as C
from .plan import PlanEntry, plan_error
from .styles import REFUSED, STYLES, Colwise, PlanContext, Rowwise

__all__ = ["check_styles", "check_heads", "group_columns", "cover_regions", "region_params",
           "is_sharded"]


def check_styles(entries: Sequence[PlanEntry]) -> None:
    """Refuse, before anything changes, every entry whose style Slapo does not honour.

    Raises:
        ConfigError: a refused style (:data:`REFUSED`, with why) or an unknown one.
    """
    for entry in entries:
        if entry.style in REFUSED:
            raise plan_error(entry, REFUSED[entry.style],
                             "schedule this module by hand, or drop it from the plan "
                             "(base_model_tp_plan / _tp_plan)")
        if entry.style not in STYLES:
            known = sorted(STYLES)
            close = fnmatch.filter(known, f"*{entry.style.split('_')[0]}*")
            raise plan_error(entry, f"unknown style '{entry.style}'",
                             f"known styles: {', '.join(known)}"
                             + (f" (close: {', '.join(close)})" if close else ""))


def _forward_arg_feeds_only(mod: nn.Module, children: Set[str]) -> bool:
    """Whether ``mod.forward`` uses its first argument only as the input of ``self.<child>``
    calls for ``children`` (or to read its shape/dtype/device): then the gradient of that
    argument is exactly the sum of those children's input gradients."""
    try:
        fn = inspect.unwrap(type(mod).forward)
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    func = tree.body[0]
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(func.args.args) < 2:
        return False
    arg = func.args.args[1].arg
    parents = {child: node for node in ast.walk(func) for child in ast.iter_child_nodes(node)}
    uses = [n for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == arg]
    for use in uses:
        up = parents.get(use)
        if not isinstance(use.ctx, ast.Load):
            return False
        if isinstance(up, ast.Attribute) and up.attr in ("shape", "dtype", "device", "ndim"):
            continue
        if (isinstance(up, ast.Call) and use in up.args and isinstance(up.func, ast.Attribute)
                and isinstance(up.func.value, ast.Name) and up.func.value.id == "self"
                and up.func.attr in children):
            continue
        return False
    return bool(uses)


def group_columns(sch: Schedule, entries: Sequence[PlanEntry]) -> Dict[str, List[str]]:
    """Parent path -> its column-parallel children that share the parent's input (at least
    two, fed nothing else): one input-gradient all-reduce on the parent serves them all."""
    by_parent: Dict[str, List[str]] = {}
    for e in entries:
        if isinstance(STYLES[e.style], Colwise) and e.param is None and "." in e.path:
            by_parent.setdefault(e.path.rpartition(".")[0], []).append(e.path)
    groups = {}
    for parent, paths in by_parent.items():
        names = {p.rpartition(".")[2] for p in paths}
        if len(paths) > 1 and _forward_arg_feeds_only(sch[parent].mod, names):
            groups[parent] = paths
    return groups


def check_heads(sch: Schedule, entries: Sequence[PlanEntry]) -> None:
    """Column-parallel head projections (plain ``colwise`` under a module with ``head_dim``)
    must split into whole heads: the TP size must divide every projection's head count (with
    GQA the kv heads).

    Raises:
        ConfigError: naming the projection, its head count and the TP size.
    """
    ws = sch.world_size
    for e in entries:
        if STYLES[e.style] != Colwise() or e.param is not None or "." not in e.path:
            continue
        head_dim = getattr(sch[e.path.rpartition(".")[0]].mod, "head_dim", None)
        mod = sch[e.path].mod
        out = getattr(mod, "out_features", None)
        if not isinstance(head_dim, int) or not out or out % head_dim:
            continue
        heads = out // head_dim
        if heads % ws:
            raise ConfigError(
                f"{e.describe()}: '{e.path}' projects to {heads} heads (of {head_dim}), which "
                f"cannot be split over {ws} tensor-parallel ranks", path=e.path,
                call="apply_schedule('auto')", module=mod,
                hint=f"use a tensor-parallel size that divides {heads} (the key/value heads "
                "with grouped-query attention)")


def is_sharded(mod: nn.Module) -> bool:
    """Whether any of ``mod``'s own parameters is sharded."""
    return any(get_shard_spec(p) is not None for p in mod.parameters(recurse=False))


def _common(a: str, b: str) -> str:
    parts = []
    for x, y in zip(a.split("."), b.split(".")):
        if x != y:
            break
        parts.append(x)
    return ".".join(parts)


def _regions(entries: Sequence[PlanEntry]) -> Set[str]:
    """Where activations are sharded: for each column-parallel module whose output is not
    gathered back, the nearest common ancestor with a row-parallel module that does not split
    its input again (the deepest such ancestor: q/k/v pair with their attention's output
    projection, also when it sits one level down as in NeoMME's ``output_projection.o_proj``;
    not with the MLP's, whose common ancestor, the layer, is farther). olmo2's gathered q/k/v
    feed whole-hidden norms, so they open no region."""
    styles = [(e, STYLES[e.style]) for e in entries if e.param is None]
    cols = [e.path for e, s in styles if isinstance(s, Colwise) and not s.gather_output]
    rows = [e.path for e, s in styles if isinstance(s, Rowwise) and not s.split_input]
    regions: Set[str] = set()
    for col in cols:
        commons = [_common(col, row) for row in rows]
        best = max(commons, key=lambda c: c.count(".") if c else -1, default="")
        if best and best != col:
            regions.add(best)
    return regions


def region_params(sch: Schedule, entries: Sequence[PlanEntry]) -> List[str]:
    """Modules holding parameters the plan does not name inside a tensor-parallel region
    (:func:`_regions`): the activations they touch are sharded, so their gradients are
    partial. Only scalars (a learnable activation's ``alpha``) are returned, to get
    ``all_reduce_grads``; anything larger is refused (it would need its own shard). Changes
    nothing.

    Raises:
        ConfigError: naming the module and its parameters.
    """
    named = {e.path for e in entries} | {e.target for e in entries}
    scalars: List[str] = []
    for region in sorted(_regions(entries)):
        for path, mod in sch[region].mod.named_modules():
            full = C.join(region, path)
            params = dict(mod.named_parameters(recurse=False))
            if not params or full in named or is_sharded(mod) or any(
                    full.startswith(n + ".") for n in named):
                continue
            if all(p.numel() == 1 for p in params.values()):
                scalars.append(full)
                continue
            raise ConfigError(
                f"'{full}' holds parameters {sorted(params)} inside the tensor-parallel region "
                f"'{region}' that the plan does not shard: they would see sharded activations",
                path=full, call="apply_schedule('auto')", module=mod,
                hint="add a plan entry for it, or schedule this model by hand")
    return scalars


def cover_regions(ctx: PlanContext, entries: Sequence[PlanEntry]) -> None:
    """``all_reduce_grads`` on the scalar parameters of :func:`region_params`.

    Raises:
        ConfigError: a larger parameter inside a region (:func:`region_params`).
    """
    for full in region_params(ctx.sch, entries):
        ctx.sch[full].all_reduce_grads()
        ctx.handled.add(full)
