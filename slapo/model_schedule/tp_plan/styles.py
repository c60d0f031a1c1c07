"""The plan's styles, one small class each: how one plan entry becomes Slapo primitives.

As in PyTorch's ``torch.distributed.tensor.parallel`` (``ColwiseParallel(output_layouts=...)``),
a style is a parameterised object; here its parameters say what happens around the sharded
module (gather the output, split the input, packed blocks) and :meth:`Style.apply` makes the
primitive calls (``shard``, ``sync``, ``all_reduce_grads``) through the helpers of
:mod:`slapo.model_schedule.common`. Styles are frozen dataclasses: equal parameters, equal
styles.

:data:`STYLES` maps every HF plan string Slapo honours to an instance. HF registers some
layouts under two names (``colwise_gather_output`` and ``colwise_rep``, ``rowwise_split_input``
and ``rowwise_rep``): both names map to equal instances and are treated alike everywhere.
The strings Slapo refuses are in :data:`REFUSED` (checked by :mod:`.checks`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Dict, List, Optional, Set

from torch import nn

from ...schedule import Schedule
from .. import common as C
from .. import moe
from ..config import ScheduleConfig
from .plan import PlanEntry, plan_error

__all__ = ["PlanContext", "Style", "Colwise", "Rowwise", "ReplicatedGradAllReduce",
           "Embedding", "AllReduceOutput", "Replicate", "Experts", "STYLES", "REFUSED",
           "EXPERTS_STYLE", "plain_linear", "plain_embedding"]

EXPERTS_STYLE = moe.EXPERTS_STYLE


@dataclasses.dataclass
class PlanContext:
    """What the styles share: the schedule, the knobs, the mode, the column-parallel modules
    whose input gradient their parent reduces (``grouped``), what was handled, and for
    mixture-of-experts the sub-plans below each experts module (``experts``), the dense
    entries' paths (``dense_paths``) and the ``expert_parallel`` knob."""

    sch: Schedule
    cfg: ScheduleConfig
    mode: C.TPMode
    grouped: Set[str] = dataclasses.field(default_factory=set)
    handled: Set[str] = dataclasses.field(default_factory=set)
    experts: Dict[str, Dict[str, str]] = dataclasses.field(default_factory=dict)
    dense_paths: Set[str] = dataclasses.field(default_factory=set)
    expert_parallel: bool = False


class Style:
    """A plan style: :meth:`apply` turns one entry into primitive calls. ``keeps_whole``
    (class flag): the module's parameters stay whole on purpose (not reported as left
    unsharded, and they win over the vocab-parallel embedding and head)."""

    keeps_whole: ClassVar[bool] = False

    def check(self, ctx: PlanContext, entry: PlanEntry) -> None:
        """Raise ``ConfigError`` (naming the entry) when ``entry``'s module does not fit this
        style; changes nothing. Runs for every entry before the first :meth:`apply`."""

    def apply(self, ctx: PlanContext, entry: PlanEntry) -> None:
        """Turn ``entry`` into primitive calls on ``ctx.sch``."""
        raise NotImplementedError


def plain_linear(mod: Optional[nn.Module]) -> bool:
    """Whether ``mod`` is an ``nn.Linear`` (or HF Conv1D) whose only state is ``weight`` and
    ``bias``: a subclass with more parameters (Dory's LM head scales its logits by a learned
    per-token ``logit_scale``) cannot be sharded by its weight alone."""
    return (isinstance(mod, nn.Linear) or C._is_conv1d(mod)) and not any(
        True for _ in mod.children()) and {n for n, _ in mod.named_parameters()} <= {
        "weight", "bias"}


def _linear(ctx: PlanContext, entry: PlanEntry) -> nn.Module:
    """The plain Linear ``entry`` names (``ConfigError`` naming the entry otherwise)."""
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


@dataclasses.dataclass(frozen=True)
class _LinearStyle(Style):
    """A plain Linear (or HF Conv1D) sharded by :meth:`shard`. ``packed``: its weight holds
    two packed blocks (gate|up) and each rank takes a slice of each (``fused=2``)."""

    packed: bool = False

    def check(self, ctx: PlanContext, entry: PlanEntry) -> None:
        """``entry`` must name a plain Linear (or HF Conv1D)."""
        _linear(ctx, entry)

    def apply(self, ctx: PlanContext, entry: PlanEntry) -> None:
        """:meth:`shard` the Linear ``entry`` names."""
        self.shard(ctx, entry.path, fused=2 if self.packed else 1)

    def shard(self, ctx: PlanContext, path: str, fused: int) -> None:
        """The primitive calls on the Linear at ``path``."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Colwise(_LinearStyle):
    """Column-parallel Linear: ``shard(weight/bias, axis=0)``, the input gradient all-reduced
    (by the parent when it feeds several projections, ``ctx.grouped``; not with sequence
    parallelism). ``gather_output``: then ``sync("fwd_post", "all_gather", -1)`` (HF
    ``colwise_gather_output``, ``colwise_rep``). ``packed=True``: HF ``packed_colwise``."""

    gather_output: bool = False

    def shard(self, ctx: PlanContext, path: str, fused: int) -> None:
        """Column-parallel (``common.column_parallel``), then the gather if asked."""
        C.column_parallel(ctx.sch[path], ctx.mode, grad_sync=path not in ctx.grouped,
                          fused=fused)
        if self.gather_output:
            ctx.sch[path].sync("fwd_post", "all_gather", axis=-1)


@dataclasses.dataclass(frozen=True)
class Rowwise(_LinearStyle):
    """Row-parallel Linear: ``shard(weight, axis=1)`` and its partial output all-reduced
    (reduce-scattered along the sequence with sequence parallelism); the bias is added once.
    ``split_input``: the whole input is first split, ``sync("fwd_pre", "scatter", -1)`` (HF
    ``rowwise_split_input``, ``rowwise_rep``). ``packed=True``: HF ``packed_rowwise`` (the
    plan's packed styles are refused with sequence parallelism)."""

    split_input: bool = False

    def shard(self, ctx: PlanContext, path: str, fused: int) -> None:
        """Row-parallel (``common.row_parallel``), the input split first if asked."""
        C.row_parallel(ctx.sch[path], ctx.mode, fused=fused)
        if self.split_input:
            ctx.sch[path].sync("fwd_pre", "scatter", axis=-1)


@dataclasses.dataclass(frozen=True)
class ReplicatedGradAllReduce(Style):
    """Whole weights on every rank, their gradients summed over the group in backward
    (``all_reduce_grads``, a gradient hook): HF ``replicated_with_grad_allreduce`` (e.g.
    Qwen3's q/k norms, which see sharded heads)."""

    keeps_whole: ClassVar[bool] = True

    def apply(self, ctx: PlanContext, entry: PlanEntry) -> None:
        """``all_reduce_grads`` on the named parameter, or on the module's own parameters."""
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


@dataclasses.dataclass(frozen=True)
class Embedding(Style):
    """A plain ``nn.Embedding`` sharded on ``axis``: 0 = vocab-parallel
    (``common.shard_embedding``: partial lookups all-reduced; whole with ``shard_embedding``
    off; HF ``embedding_rowwise``), 1 = ``shard(weight, axis=1)`` and the lookups all-gathered
    (HF ``embedding_colwise``)."""

    axis: int = 0

    def check(self, ctx: PlanContext, entry: PlanEntry) -> None:
        """``entry`` must name a plain ``nn.Embedding`` (:func:`plain_embedding`)."""
        mod = ctx.sch[entry.path].mod
        if not plain_embedding(mod):
            raise plan_error(entry, "expects a plain nn.Embedding (only a 'weight', no "
                             f"submodules), found {type(mod).__name__} with "
                             f"{sorted(n for n, _ in mod.named_parameters())}",
                             "mark it 'replicate' in the plan, or schedule it by hand", mod)

    def apply(self, ctx: PlanContext, entry: PlanEntry) -> None:
        """Shard the embedding at ``entry.path`` (class docs)."""
        node = ctx.sch[entry.path]
        if self.axis == 0:
            if ctx.cfg.shard_embedding:  # with the knob off the embedding stays whole
                C.shard_embedding(ctx.sch, [entry.path])
            return
        node.shard("weight", axis=1)
        node.sync("fwd_post", "all_gather", axis=-1)


@dataclasses.dataclass(frozen=True)
class AllReduceOutput(Style):
    """The module's (partial) output all-reduced, ``sync("fwd_post", "all_reduce")``: HF
    ``all_reduce``."""

    def apply(self, ctx: PlanContext, entry: PlanEntry) -> None:
        """All-reduce the output of the module at ``entry.path``."""
        ctx.sch[entry.path].sync("fwd_post", "all_reduce")


@dataclasses.dataclass(frozen=True)
class Replicate(Style):
    """Nothing: every rank keeps whole tensors (HF ``replicate``) or runs on its local ones (HF
    ``local_params``), which is what Slapo's sharded modules do anyway."""

    keeps_whole: ClassVar[bool] = True

    def apply(self, ctx: PlanContext, entry: PlanEntry) -> None:
        """No primitive call."""


ROUTER_NAMES = ("gate", "router")


@dataclasses.dataclass(frozen=True)
class Experts(Style):
    """An HF experts module (HF ``moe_tp_experts``): ``moe.shard_experts`` with the entries
    below it as its plan (``ctx.experts``), tensor parallelism inside every expert or, with
    ``ctx.expert_parallel``, whole experts per rank; a sibling router (``gate``/``router``) the
    plan does not name stays whole (``moe.replicate_router``)."""

    def check(self, ctx: PlanContext, entry: PlanEntry) -> None:
        """Everything ``moe.shard_experts`` and ``moe.replicate_router`` would refuse."""
        moe.check_experts(ctx.sch, entry.path, ctx.mode, ctx.experts[entry.path],
                          expert_parallel=ctx.expert_parallel)
        for router in self.routers(ctx, entry):
            moe.check_router(ctx.sch, router)

    def routers(self, ctx: PlanContext, entry: PlanEntry) -> List[str]:
        """The sibling routers (``gate``/``router``) the plan does not name."""
        parent = entry.path.rpartition(".")[0]
        return [C.join(parent, name) for name in ROUTER_NAMES
                if C.join(parent, name) in ctx.sch and C.join(parent, name) not in ctx.dense_paths]

    def apply(self, ctx: PlanContext, entry: PlanEntry) -> None:
        """Shard the experts at ``entry.path`` and replicate their router."""
        moe.shard_experts(ctx.sch, entry.path, ctx.cfg, ctx.mode, ctx.experts[entry.path],
                          expert_parallel=ctx.expert_parallel)
        ctx.handled.add(entry.path)
        for router in self.routers(ctx, entry):
            moe.replicate_router(ctx.sch, router)
            ctx.handled.add(router)


STYLES: Dict[str, Style] = {
    "colwise": Colwise(),
    "colwise_rep": Colwise(gather_output=True),
    "colwise_gather_output": Colwise(gather_output=True),
    "packed_colwise": Colwise(packed=True),
    "rowwise": Rowwise(),
    "rowwise_rep": Rowwise(split_input=True),
    "rowwise_split_input": Rowwise(split_input=True),
    "packed_rowwise": Rowwise(packed=True),
    "replicated_with_grad_allreduce": ReplicatedGradAllReduce(),
    "embedding_rowwise": Embedding(axis=0),
    "embedding_colwise": Embedding(axis=1),
    "all_reduce": AllReduceOutput(),
    "replicate": Replicate(),
    "local_params": Replicate(),
    EXPERTS_STYLE: Experts(),
}

REFUSED = {
    "mla_kv_a_proj": "multi-head latent attention (DeepSeek-V2 style kv_a_proj_with_mqa) is not "
                     "supported by the auto schedule yet",
    "moe_identity_expert": "identity (zero-compute) experts are not supported by the auto "
                           "schedule yet",
    "sequence_parallel": "the plan's own sequence-parallel style is not supported; use the "
                         "sequence_parallel knob",
}
