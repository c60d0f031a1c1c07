"""A HuggingFace model's own tensor-parallel plan as Slapo primitives.

transformers 5 models declare how they shard: the config class's ``base_model_tp_plan`` (globs
relative to the base model, e.g. ``layers.*.self_attn.q_proj: colwise``) and the model class's
``_tp_plan`` (relative to the model, e.g. ``lm_head: colwise_gather_output``). This module

* reads the plan (:func:`read_plan`: the base-model prefix added) and resolves it against the
  model's real module and parameter paths (:func:`resolve_plan`: each ``*`` is one path part);
* applies it (:func:`apply_plan`): one handler per style (:data:`STYLES`), each a few Slapo
  primitive calls (``shard``, ``sync``, :class:`AllReduceGrads`) through the helpers of
  :mod:`slapo.model_schedule.common`. A style Slapo cannot honour is *refused* with a
  ``ConfigError`` naming the entry (glob and style) and why; an unknown style is an error too.

What each style becomes (``mode.sp`` variants as in ``common``):

=================================  ===============================================================
style                              primitives
=================================  ===============================================================
``colwise``                        ``shard(weight/bias, axis=0)``; input gradient all-reduced
``colwise_gather_output``          as ``colwise``, then ``sync("fwd_post", "all_gather", -1)``
``packed_colwise`` (Linear)        ``shard(..., axis=0, fused=2)``: a slice of each packed block
``rowwise``                        ``shard(weight, axis=1)``; ``sync("fwd_post", "all_reduce")``
``rowwise_split_input``            ``sync("fwd_pre", "scatter", -1)`` then ``rowwise``
``packed_rowwise`` (Linear)        ``rowwise`` with ``fused=2``
``replicated_with_grad_allreduce`` ``all_reduce_grads()``: whole weights, gradients summed
``embedding_rowwise``              vocab-parallel embedding (``common.shard_embedding``)
``embedding_colwise``              ``shard(weight, axis=1)``; ``sync("fwd_post", "all_gather")``
``all_reduce``                     ``sync("fwd_post", "all_reduce")``
``replicate`` / ``local_params``   nothing (every rank keeps the whole tensors / runs locally)
``moe_tp_experts`` (+ entries      ``moe.shard_experts`` (the entries below it as its plan); the
below it)                          sibling router through ``moe.replicate_router``
``mla_kv_a_proj``,                 refused (see :data:`REFUSED`)
``moe_identity_expert``
=================================  ===============================================================

Column-parallel projections that read the same input (q/k/v, gate/up) get ONE input-gradient
all-reduce on their parent module, as the hand-written recipes do (``grad_entry``), when the
parent's ``forward`` passes its first argument to nothing but those projections (read from its
source); otherwise each projection reduces its own. Under TP the kv heads of a column-parallel
attention must divide by the TP size (``ConfigError`` naming the module otherwise).

Modules whose parameters the plan leaves whole (norms, an unlisted attention...) are reported:
one ``warnings.warn`` and ``sch.metadata["tp_plan_unsharded"]`` on the root (``explain`` shows it).
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import inspect
import re
import textwrap
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from torch import nn

from ..errors import ConfigError
from ..primitives.all_reduce_grads import AllReduceGrads
from ..schedule import Schedule
from ..sharding.spec import get_shard_spec
from . import common as C
from .config import ScheduleConfig

__all__ = ["PlanEntry", "read_plan", "resolve_plan", "apply_plan", "STYLES", "REFUSED",
           "COLUMN_STYLES", "AllReduceGrads", "unsharded_modules", "plain_embedding",
           "plain_linear"]

COLUMN_STYLES = ("colwise", "colwise_gather_output", "packed_colwise")
# Styles that keep a module's parameters whole on purpose (not reported as left unsharded).
REPLICATED_STYLES = ("replicate", "replicated_with_grad_allreduce", "local_params")
EXPERTS_STYLE = "moe_tp_experts"
REFUSED = {
    "mla_kv_a_proj": "multi-head latent attention (DeepSeek-V2 style kv_a_proj_with_mqa) is not "
                     "supported by the auto schedule yet",
    "moe_identity_expert": "identity (zero-compute) experts are not supported by the auto "
                           "schedule yet",
    "sequence_parallel": "the plan's own sequence-parallel style is not supported; use the "
                         "sequence_parallel knob",
}


@dataclasses.dataclass(frozen=True)
class PlanEntry:
    """One resolved plan entry: ``glob`` as written (with the base-model prefix), its
    ``style``, the module ``path`` it names, and ``param`` when it names a parameter of that
    module instead of the module itself."""

    glob: str
    style: str
    path: str
    param: Optional[str] = None

    @property
    def target(self) -> str:
        """The full dotted name the entry addresses (module or parameter)."""
        return C.join(self.path, self.param or "")

    def describe(self) -> str:
        return f"plan entry '{self.glob}: {self.style}' (at '{self.target}')"


def read_plan(model: nn.Module) -> Dict[str, str]:
    """The model's tensor-parallel plan, globs relative to ``model``: the config class's
    ``base_model_tp_plan`` under the base-model prefix (``model.`` for ``LlamaForCausalLM``),
    then the model class's own ``_tp_plan`` (``lm_head``). Empty when the model declares none.
    A ``base_model_tp_plan`` set on the config instance overrides the class's."""
    config = getattr(model, "config", None)
    base = dict(getattr(config, "base_model_tp_plan", None) or {})  # instance overrides class
    prefix = getattr(model, "base_model_prefix", "") or ""
    if not (prefix and isinstance(getattr(model, prefix, None), nn.Module)):
        prefix = ""  # the model is the base model itself
    plan = {C.join(prefix, glob): style for glob, style in base.items()}
    plan.update(dict(getattr(type(model), "_tp_plan", None) or {}))
    return plan


def _glob_regex(glob: str) -> "re.Pattern[str]":
    return re.compile("^" + r"\.".join("[^.]+" if part == "*" else re.escape(part)
                                       for part in glob.split(".")) + "$")


def resolve_plan(model: nn.Module, plan: Dict[str, str]) -> List[PlanEntry]:
    """Expand every glob of ``plan`` over the model's module and parameter names (``*`` = one
    path part, e.g. a layer index), in the model's module order. Globs that match nothing (a
    layer kind this model lacks, a tied ``lm_head``...) are dropped."""
    modules = [name for name, _ in model.named_modules()]
    params = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    entries: List[PlanEntry] = []
    for glob, style in plan.items():
        regex = _glob_regex(glob)
        hits = [PlanEntry(glob, style, m) for m in modules if regex.match(m)]
        if not hits:
            hits = [PlanEntry(glob, style, *p.rpartition(".")[::2])
                    for p in params if regex.match(p)]
        entries += hits
    order = {name: i for i, name in enumerate(modules)}
    return sorted(entries, key=lambda e: (order.get(e.path, -1), e.param or ""))


def plan_error(entry: PlanEntry, why: str, hint: str, mod: Optional[nn.Module] = None
               ) -> ConfigError:
    """The ``ConfigError`` for a plan entry Slapo cannot honour."""
    return ConfigError(f"{entry.describe()}: {why}", path=entry.target,
                       call="apply_schedule('auto')", module=mod, hint=hint)


# ------------------------------------------------------------------ style handlers
@dataclasses.dataclass
class PlanContext:
    """What the handlers share: the schedule, the knobs, the mode, the column-parallel modules
    whose input gradient their parent reduces, and what was handled."""

    sch: Schedule
    cfg: ScheduleConfig
    mode: C.TPMode
    grouped: Set[str] = dataclasses.field(default_factory=set)
    handled: Set[str] = dataclasses.field(default_factory=set)


def plain_linear(mod: Optional[nn.Module]) -> bool:
    """Whether ``mod`` is an ``nn.Linear`` (or HF Conv1D) whose only state is ``weight`` and
    ``bias``: a subclass with more parameters (Dory's LM head scales its logits by a learned
    per-token ``logit_scale``) cannot be sharded by its weight alone."""
    return (isinstance(mod, nn.Linear) or C._is_conv1d(mod)) and not any(
        True for _ in mod.children()) and {n for n, _ in mod.named_parameters()} <= {
        "weight", "bias"}


def _linear(ctx: PlanContext, entry: PlanEntry) -> nn.Module:
    mod = ctx.sch[entry.path].mod
    if entry.param is not None or not (isinstance(mod, nn.Linear) or C._is_conv1d(mod)):
        raise plan_error(entry, f"style '{entry.style}' is applied to Linear modules here, "
                         f"not to {'a parameter' if entry.param else type(mod).__name__}",
                         "only expert tensors below a 'moe_tp_experts' module may be named "
                         "directly", mod)
    if not plain_linear(mod):
        extra = sorted(n for n, _ in mod.named_parameters() if n not in ("weight", "bias"))
        raise plan_error(entry, f"{type(mod).__name__} holds parameters {extra} besides "
                         "weight/bias, which its own forward uses on the output: sharding "
                         "the weight alone would be wrong", "schedule this module by hand, or "
                         "mark it 'replicate' in the plan", mod)
    return mod


def _colwise(ctx: PlanContext, entry: PlanEntry, *, fused: int = 1,
             gather: bool = False) -> None:
    mod = _linear(ctx, entry)
    node = ctx.sch[entry.path]
    grad_sync = entry.path not in ctx.grouped
    if fused == 1:
        C.column_parallel(node, ctx.mode, grad_sync=grad_sync)
    else:
        names = ["weight"] + (["bias"] if getattr(mod, "bias", None) is not None else [])
        node.shard(names, axis=1 if C._is_conv1d(mod) else 0, fused=fused)
        if grad_sync and not ctx.mode.sp:
            node.sync("bwd_post", "all_reduce")
    if gather:
        node.sync("fwd_post", "all_gather", axis=-1)


def _rowwise(ctx: PlanContext, entry: PlanEntry, *, fused: int = 1,
             split_input: bool = False) -> None:
    mod = _linear(ctx, entry)
    node = ctx.sch[entry.path]
    if fused == 1:
        C.row_parallel(node, ctx.mode)
    else:
        node.shard("weight", axis=0 if C._is_conv1d(mod) else 1, fused=fused)
        node.sync("fwd_post", "all_reduce")
    if split_input:
        node.sync("fwd_pre", "scatter", axis=-1)


def _replicated_grads(ctx: PlanContext, entry: PlanEntry) -> None:
    node = ctx.sch[entry.path]
    if entry.param is not None:
        node.all_reduce_grads([entry.param])
    elif any(True for _ in node.mod.parameters(recurse=False)):
        node.all_reduce_grads()


def plain_embedding(mod: Optional[nn.Module]) -> bool:
    """Whether ``mod`` is an ``nn.Embedding`` whose only state is its ``weight`` (a subclass
    that scales the lookup is fine; one with a norm or other parameters after the lookup is not:
    its sharded partial lookups could not be summed after the module, and those parameters'
    gradients would be partial)."""
    return isinstance(mod, nn.Embedding) and not any(True for _ in mod.children()) and [
        n for n, _ in mod.named_parameters()] == ["weight"]


def _embedding(ctx: PlanContext, entry: PlanEntry, *, axis: int) -> None:
    node = ctx.sch[entry.path]
    if not plain_embedding(node.mod):
        raise plan_error(entry, "expects a plain nn.Embedding (only a 'weight', no submodules), "
                         f"found {type(node.mod).__name__} with "
                         f"{sorted(n for n, _ in node.mod.named_parameters())}",
                         "mark it 'replicate' in the plan, or schedule it by hand", node.mod)
    if axis == 0:
        if ctx.cfg.shard_embedding:  # with the knob off the embedding stays whole
            C.shard_embedding(ctx.sch, [entry.path])
        return
    node.shard("weight", axis=1)
    node.sync("fwd_post", "all_gather", axis=-1)


def _nothing(ctx: PlanContext, entry: PlanEntry) -> None:
    """``replicate`` / ``local_params``: every rank keeps whole tensors or runs on local ones,
    which is what Slapo's sharded modules do anyway."""


Handler = Callable[[PlanContext, PlanEntry], None]
STYLES: Dict[str, Handler] = {
    "colwise": _colwise,
    "colwise_rep": lambda ctx, e: _colwise(ctx, e, gather=True),
    "colwise_gather_output": lambda ctx, e: _colwise(ctx, e, gather=True),
    "packed_colwise": lambda ctx, e: _colwise(ctx, e, fused=2),
    "rowwise": _rowwise,
    "rowwise_rep": lambda ctx, e: _rowwise(ctx, e, split_input=True),
    "rowwise_split_input": lambda ctx, e: _rowwise(ctx, e, split_input=True),
    "packed_rowwise": lambda ctx, e: _rowwise(ctx, e, fused=2),
    "replicated_with_grad_allreduce": _replicated_grads,
    "embedding_rowwise": lambda ctx, e: _embedding(ctx, e, axis=0),
    "embedding_colwise": lambda ctx, e: _embedding(ctx, e, axis=1),
    "all_reduce": lambda ctx, e: ctx.sch[e.path].sync("fwd_post", "all_reduce"),
    "replicate": _nothing,
    "local_params": _nothing,
}


# ------------------------------------------------------------------ applying a plan
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
        if entry.style not in STYLES and entry.style != EXPERTS_STYLE:
            known = sorted([*STYLES, EXPERTS_STYLE])
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
        if e.style in COLUMN_STYLES and e.param is None and "." in e.path:
            by_parent.setdefault(e.path.rpartition(".")[0], []).append(e.path)
    groups = {}
    for parent, paths in by_parent.items():
        names = {p.rpartition(".")[2] for p in paths}
        if len(paths) > 1 and _forward_arg_feeds_only(sch[parent].mod, names):
            groups[parent] = paths
    return groups


def check_heads(sch: Schedule, entries: Sequence[PlanEntry]) -> None:
    """Column-parallel head projections (``colwise`` under a module with ``head_dim``) must
    split into whole heads: the TP size must divide every projection's head count (with GQA
    the kv heads).

    Raises:
        ConfigError: naming the projection, its head count and the TP size.
    """
    ws = sch.world_size
    for e in entries:
        if e.style != "colwise" or e.param is not None or "." not in e.path:
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


def _experts_plan(entries: Sequence[PlanEntry]) -> Tuple[Dict[str, Dict[str, str]],
                                                         List[PlanEntry]]:
    """Split off the mixture-of-experts part: experts path -> its sub-plan (names relative to
    it), and the dense entries."""
    experts = {e.path: {} for e in entries if e.style == EXPERTS_STYLE and e.param is None}
    dense = []
    for e in entries:
        owner = next((p for p in experts if e.target.startswith(p + ".")), None)
        if owner is not None:
            experts[owner][e.target[len(owner) + 1:]] = e.style
        elif e.style != EXPERTS_STYLE:
            dense.append(e)
    return experts, dense


ROUTER_NAMES = ("gate", "router")


def _shard_moe(ctx: PlanContext, experts: Dict[str, Dict[str, str]],
               entries: Sequence[PlanEntry], expert_parallel: bool) -> None:
    """Experts modules (and their sibling routers) through :mod:`slapo.model_schedule.moe`."""
    if not experts:
        return
    from . import moe

    for path, sub in experts.items():
        moe.shard_experts(ctx.sch, path, ctx.cfg, ctx.mode, sub, expert_parallel=expert_parallel)
        ctx.handled.add(path)
        parent = path.rpartition(".")[0]
        for name in ROUTER_NAMES:
            router = C.join(parent, name)
            if router in ctx.sch and router not in {e.path for e in entries}:
                moe.replicate_router(ctx.sch, router)
                ctx.handled.add(router)


def apply_plan(sch: Schedule, entries: Sequence[PlanEntry], cfg: ScheduleConfig,
               mode: C.TPMode, *, expert_parallel: bool = False) -> PlanContext:
    """Apply resolved plan ``entries`` with Slapo primitives (nothing without TP); returns
    what was done (:class:`PlanContext`). Checks every entry before changing anything.

    Raises:
        ConfigError: a refused or unknown style, heads the TP size does not divide, an entry
            whose module does not fit its style (all naming the entry).
    """
    ctx = PlanContext(sch, cfg, mode)
    check_styles(entries)
    if not mode.tp:
        return ctx
    experts, dense = _experts_plan(entries)
    check_heads(sch, dense)
    groups = group_columns(sch, dense)
    ctx.grouped = {p for paths in groups.values() for p in paths}
    for entry in dense:
        STYLES[entry.style](ctx, entry)
        if entry.style in REPLICATED_STYLES:
            ctx.handled.add(entry.path)
    for parent in groups:
        if not mode.sp:
            sch[parent].sync("bwd_post", "all_reduce")
    _uncovered_in_regions(ctx, dense)
    _shard_moe(ctx, experts, dense, expert_parallel)
    return ctx


def _is_sharded(mod: nn.Module) -> bool:
    return any(get_shard_spec(p) is not None for p in mod.parameters(recurse=False))


def unsharded_modules(sch: Schedule, handled: Set[str]) -> List[str]:
    """Modules holding parameters of their own, none of them sharded, that no plan entry
    handled (as globs over layer indices, e.g. ``model.layers.*.input_layernorm``)."""
    found: List[str] = []
    for path, mod in sch.mod.named_modules():
        if not any(True for _ in mod.parameters(recurse=False)) or _is_sharded(mod):
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


def _uncovered_in_regions(ctx: PlanContext, entries: Sequence[PlanEntry]) -> None:
    """Parameters the plan does not name that sit inside a tensor-parallel region (a module
    with both column- and row-parallel children): the activations they touch are sharded, so
    their gradients are partial. Scalars (a learnable activation's ``alpha``) get
    ``all_reduce_grads``; anything larger is refused (it would need its own shard).

    Raises:
        ConfigError: naming the module and its parameters.
    """
    named = {e.path for e in entries} | {e.target for e in entries}
    # sharded activations flow between a column-parallel output that is not gathered back and a
    # row-parallel input that is not split again (olmo2's gathered q/k/v feed whole-hidden norms)
    regions = {e.path.rpartition(".")[0] for e in entries
               if e.style in COLUMN_STYLES and e.style != "colwise_gather_output"
               and e.param is None}
    regions &= {e.path.rpartition(".")[0] for e in entries
                if "rowwise" in e.style and e.style != "rowwise_split_input"}
    for region in sorted(regions):
        for path, mod in ctx.sch[region].mod.named_modules():
            full = C.join(region, path)
            params = dict(mod.named_parameters(recurse=False))
            if not params or full in named or _is_sharded(mod) or any(
                    full.startswith(n + ".") for n in named):
                continue
            if all(p.numel() == 1 for p in params.values()):
                ctx.sch[full].all_reduce_grads()
                ctx.handled.add(full)
                continue
            raise ConfigError(
                f"'{full}' holds parameters {sorted(params)} inside the tensor-parallel region "
                f"'{region}' that the plan does not shard: they would see sharded activations",
                path=full, call="apply_schedule('auto')", module=mod,
                hint="add a plan entry for it, or schedule this model by hand")
