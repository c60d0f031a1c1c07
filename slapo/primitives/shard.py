"""``shard``: keep this rank's part of parameters/buffers for tensor parallelism."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..errors import ShardError
from ..sharding.layout import ShardInfo
from ..sharding.rules import RuleViolation, ShardContext, head_rule_for, rule_for
from ..sharding.spec import SHARD_ATTR, ShardSpec, get_shard_spec, set_shard_spec
from .annotate import copy_param_tags
from .module_checks import closest, format_call
from .registry import Primitive, register_primitive

__all__ = ["Shard", "tensor_owners"]

Owner = Tuple[str, nn.Module, str]  # (module path from the root, module, tensor attribute)


def tensor_owners(root: nn.Module, tensor: torch.Tensor) -> List[Owner]:
    """Every ``(path, module, name)`` in ``root`` holding exactly ``tensor`` (tied weights)."""
    out = []
    for path, mod in root.named_modules(remove_duplicate=False):
        for name, t in list(mod._parameters.items()) + list(mod._buffers.items()):
            if t is tensor and all(m is not mod or n != name for _, m, n in out):
                out.append((path, mod, name))
    return out


def _vocab_hint(sch, size: int, ws: int) -> Optional[str]:
    config = getattr(sch.root.mod, "config", None)
    if getattr(config, "vocab_size", None) == size:
        return f"pad vocab_size to a multiple of {ws}"
    return None


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
                projection sharded without the right ``fused``.
        """
        names_list = [names] if isinstance(names, str) else list(names) \
            if isinstance(names, (list, tuple)) else None
        call = format_call("shard", names, axis=axis, **({"fused": fused} if fused != 1 else {}))

        def error(what: str, hint: str, mod: Optional[nn.Module] = None) -> ShardError:
            return ShardError(what, path=sch.path, call=call, module=mod or sch.mod, hint=hint)

        if not names_list or not all(isinstance(n, str) for n in names_list):
            raise error(f"names must be a str or a list of str, got {names!r}",
                        "e.g. shard('weight', axis=0) or shard(['weight', 'bias'], axis=0)")
        if len(set(names_list)) != len(names_list):
            raise error(f"names {names_list} contain duplicates", "name each tensor once")
        if not isinstance(axis, int) or isinstance(axis, bool):
            raise error(f"axis must be an int, got {axis!r}", "e.g. axis=0")
        if not isinstance(fused, int) or isinstance(fused, bool) or fused < 1:
            raise error(f"fused must be a positive int, got {fused!r}",
                        "fused=3 for a fused q/k/v projection, else leave it out")
        ws, rank = sch.world_size, sch.rank
        ctx = ShardContext(ws, rank)
        known = [n for n, _ in sch.mod.named_parameters()] + [n for n, _ in sch.mod.named_buffers()]

        # ---- validate everything before changing anything
        plan: Dict[int, Tuple[torch.Tensor, int, List[Owner]]] = {}
        named: set = set()  # (id(module), name) named by this call
        per_owner: Dict[int, Tuple[nn.Module, str, Dict[str, int]]] = {}
        for full_name in names_list:
            prefix, _, leaf = full_name.rpartition(".")
            try:
                owner = sch.mod.get_submodule(prefix) if prefix else sch.mod
            except AttributeError:
                owner = None
            tensor = None if owner is None else owner._parameters.get(leaf,
                                                                    owner._buffers.get(leaf))
            if tensor is None:
                raise error(f"no parameter or buffer named '{full_name}'",
                            closest(full_name, known))
            rule = rule_for(owner)
            ax = axis + tensor.dim() if -tensor.dim() <= axis < 0 else axis
            try:
                ax = rule.tensor_axis(owner, leaf, tensor, ax)
            except RuleViolation as v:
                raise error(v.what, v.hint, owner) from None
            if not 0 <= ax < tensor.dim():
                raise error(f"axis {axis} is out of range for '{full_name}' of shape "
                            f"{tuple(tensor.shape)}",
                            f"use an axis in 0..{tensor.dim() - 1}", owner)
            spec = get_shard_spec(tensor)
            owner_path = f"{sch.path}.{prefix}".strip(".") if prefix else sch.path
            if spec is not None:
                info = sch.root[owner_path].metadata.get("shard")
                if spec.axis == ax and (info is None or leaf not in info.named):
                    if info is not None:  # sharded already through a tied partner: no-op
                        info.named.add(leaf)
                    continue
                raise error(f"'{full_name}' is already sharded (axis {spec.axis}, "
                            f"{spec.world_size} ranks)", "shard each tensor once", owner)
            size = tensor.shape[ax]
            if size % (ws * fused):
                what = (f"{size} is not divisible by the tensor-parallel size {ws}" if fused == 1
                        else f"{size} is not divisible by {fused} fused parts x tensor-parallel "
                        f"size {ws}")
                hint = _vocab_hint(sch, size, ws) or (
                    f"choose a tensor-parallel size that divides {size // fused}, or pad that "
                    f"dimension to a multiple of {ws * fused}")
                raise error(what, hint, owner)
            owners = tensor_owners(sch.root.mod, tensor)
            plan[id(tensor)] = (tensor, ax, owners)
            named.add((id(owner), leaf))
            for opath, omod, oname in owners:
                entry = per_owner.setdefault(id(omod), (omod, opath, {}))
                entry[2][oname] = ax

        for omod, opath, new in per_owner.values():
            node = sch.root[opath]
            info = node.metadata.get("shard") or ShardInfo()
            try:
                rule_for(omod).check(omod, {**info.tensors, **new})
                _check_heads(node, omod, new, fused, ws, rule_for(omod))
            except RuleViolation as v:
                raise error(v.what, v.hint, omod) from None

        # ---- apply
        for tensor, ax, owners in plan.values():
            spec = ShardSpec(ax, ws, rank, tuple(tensor.shape), parts=fused)
            local = spec.slice_of(tensor.detach())
            if isinstance(tensor, nn.Parameter):
                new_t = nn.Parameter(local, requires_grad=tensor.requires_grad)
                copy_param_tags(tensor, new_t, sch.param_tags)
            else:
                new_t = local
            set_shard_spec(new_t, spec)
            for _, omod, oname in owners:
                store = omod._parameters if oname in omod._parameters else omod._buffers
                store[oname] = new_t
        sch.param_tags.add(SHARD_ATTR)
        for omod, opath, new in per_owner.values():
            node = sch.root[opath]
            info = node.metadata.setdefault("shard", ShardInfo())
            info.tensors.update(new)
            info.named.update(n for n in new if (id(omod), n) in named)
            info.fused = max(info.fused, fused)
            rule_for(omod).update(omod, info, ctx)
            _localize_heads(node, ws)


def _check_heads(node, mod: nn.Module, new: Dict[str, int], fused: int, ws: int, rule) -> None:
    """Head-count and fused-projection checks for head projections of known attention modules."""
    parent = node.parent
    head_rule = head_rule_for(parent.mod if parent is not None else None)
    if head_rule is None or node.name not in head_rule.projections(parent.mod):
        return
    out_axis = getattr(rule, "weight_out_axis", None)
    weight = getattr(mod, "weight", None)
    if out_axis is None or weight is None or new.get("weight", out_axis) != out_axis:
        return  # not a column shard of the projection
    expected = head_rule.projections(parent.mod)[node.name]
    if fused != expected:
        raise RuleViolation(
            f"'{node.name}' of {type(parent.mod).__name__} fuses {expected} projections along "
            f"its output axis; sharding it with fused={fused} would mix them across ranks",
            f"pass fused={expected}, so each rank keeps whole heads of every projection")
    head_dim = getattr(parent.mod, head_rule.head_dim)
    heads = weight.shape[out_axis] // expected // head_dim
    if heads % ws:
        raise RuleViolation(
            f"'{node.name}' has {heads} heads of size {head_dim}, which cannot be split over "
            f"{ws} ranks", f"use a tensor-parallel size that divides {heads}")
    for attr in head_rule.divide:
        value = getattr(parent.mod, attr)
        if "slapo_local_heads" not in parent.metadata and value % ws:
            raise RuleViolation(f"{type(parent.mod).__name__}.{attr} = {value} is not divisible "
                                f"by the tensor-parallel size {ws}",
                                f"use a tensor-parallel size that divides {value}")


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
