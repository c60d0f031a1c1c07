"""``shard``: keep this rank's part of parameters/buffers for tensor parallelism.

``Shard.apply`` works in two steps: :func:`~slapo.primitives.shard_plan.plan_shard` resolves and
validates the call into a :class:`~slapo.primitives.shard_plan.ShardPlan` (nothing changes if it
raises), then the plan is applied here: each tensor is sliced once, every owner re-pointed to the
new tensor, and each owner's shard rule records its layout.
"""

from __future__ import annotations

from typing import Sequence, Union

import torch
from torch import nn

from ..sharding.layout import ShardInfo
from ..sharding.rules import ShardContext, head_rule_for, rule_for
from ..sharding.spec import SHARD_ATTR, ShardSpec, set_shard_spec
from .annotate import copy_param_tags
from .registry import Primitive, register_primitive
from .shard_plan import OwnerShard, ShardPlan, TensorShard, plan_shard, tensor_owners

__all__ = ["Shard", "apply_plan", "tensor_owners"]


@register_primitive
class Shard(Primitive):
    name = "shard"

    @staticmethod
    def apply(sch, names: Union[str, Sequence[str]], axis: int, *, fused: int = 1) -> None:
        """Keep this rank's chunk of parameters/buffers ``names`` along ``axis``.

        ``names`` are (possibly dotted) parameter or buffer names relative to this module. Each
        tensor is split into ``world_size`` equal chunks (of the TP group of the schedule) and
        rank ``r`` keeps chunk ``r`` (meta tensors stay meta). A parameter becomes a new
        ``nn.Parameter`` carrying the old one's annotated tags and a
        :class:`~slapo.sharding.ShardSpec` (attribute ``slapo_shard``); every module holding the
        same Parameter (tied weights, e.g. GPT-2's ``lm_head.weight`` and ``wte.weight``) is
        pointed to the new one, and each owner's shard rule runs, so sharding either side of a
        tie shards both (sharding the other side again with the same axis is a no-op).

        The module's rule (:mod:`slapo.sharding.rules`) interprets ``axis``: ``Linear`` 0 =
        column (output features; shard ``bias`` too), 1 = row (input features; the bias stays
        whole and is added after the reduction by ``sync``); HF ``Conv1D`` (weight ``[in, out]``)
        1 = column (``["weight", "bias"]``), 0 = row; ``Embedding`` 0 = vocab-parallel, 1 =
        embedding dim; ``Conv2d`` 0 = output channels, 1 = input channels; ``BatchNorm2d`` 0
        (all per-channel tensors). The rule fixes the module's attributes (``out_features``,
        ``nf``, ``num_embeddings``, ``out_channels``, ``num_features`` ...) and records the
        module's activation layout in ``sch.metadata["shard"]`` (:class:`ShardInfo`), which
        ``sync`` and :func:`slapo.sharding.check_layouts` use. Column-sharding the head
        projections of a known attention module (BERT, GPT-2, LLaMA) also makes its per-rank
        head attributes local (e.g. GPT-2's ``split_size``).

        ``fused=k`` declares the axis a concatenation of ``k`` equal blocks (GPT-2's ``c_attn``
        output is ``[q | k | v]``: ``fused=3``); each block is split and this rank keeps chunk
        ``r`` of every block, so it gets whole heads of q, k and v.

        Raises:
            ShardError: unknown name (with the closest names), axis out of range or not
                meaningful for the module, size not divisible by ``world_size * fused``, the
                tensor is already sharded, an invalid combination (e.g. sharding the bias of a
                row-sharded Linear), a head count the TP size does not divide, or a fused
                projection sharded without the right ``fused``. Everything is checked
                (:func:`~slapo.primitives.shard_plan.plan_shard`) before anything changes.
        """
        apply_plan(sch, plan_shard(sch, names, axis, fused))


def apply_plan(sch, plan: ShardPlan) -> None:
    """Apply a validated :class:`ShardPlan` of ``sch`` (from :func:`plan_shard`)."""
    for owner_path, name in plan.tie_marks:
        sch.root[owner_path].metadata["shard"].named.add(name)
    for shard in plan.tensors:
        _slice(sch, shard, plan)
    sch.param_tags.add(SHARD_ATTR)
    ctx = ShardContext(plan.world_size, plan.rank)
    for owner in plan.owners:
        _record(sch, owner, plan, ctx)


def _slice(sch, shard: TensorShard, plan: ShardPlan) -> None:
    """Replace the tensor by this rank's chunk in every module holding it; a Parameter stays a
    Parameter with the old one's tags, and the chunk carries its ``ShardSpec``."""
    tensor = shard.tensor
    spec = ShardSpec(shard.axis, plan.world_size, plan.rank, shard.global_shape,
                     parts=plan.call.fused)
    local = spec.slice_of(tensor.detach())
    new_t: torch.Tensor
    if isinstance(tensor, nn.Parameter):
        new_t = nn.Parameter(local, requires_grad=tensor.requires_grad)
        copy_param_tags(tensor, new_t, sch.param_tags)
    else:
        new_t = local
    set_shard_spec(new_t, spec)
    for _, omod, oname in shard.owners:
        store: dict = omod._parameters if oname in omod._parameters else omod._buffers
        store[oname] = new_t


def _record(sch, owner: OwnerShard, plan: ShardPlan, ctx: ShardContext) -> None:
    """Extend the owner's ``ShardInfo`` and let its rule fix its attributes and layout."""
    node = sch.root[owner.path]
    info = node.metadata.setdefault("shard", ShardInfo())
    info.tensors.update(owner.axes)
    info.named.update(owner.named)
    info.fused = max(info.fused, plan.call.fused)
    rule_for(owner.module).update(owner.module, info, ctx)
    _localize_heads(node, plan.world_size)


def _localize_heads(node, ws: int) -> None:
    """Divide the parent attention's per-rank attributes once (first projection sharded)."""
    parent = node.parent
    head_rule = head_rule_for(parent.mod if parent is not None else None)
    if head_rule is None or node.name not in head_rule.projections(parent.mod):
        return
    info = node.metadata["shard"]
    if info.layout is None or not info.layout.input_grad_partial:
        return  # only column shards split heads
    if "slapo_local_heads" in parent.metadata:
        return
    for attr in head_rule.divide:
        setattr(parent.mod, attr, getattr(parent.mod, attr) // ws)
    parent.metadata["slapo_local_heads"] = {a: getattr(parent.mod, a) for a in head_rule.divide}
