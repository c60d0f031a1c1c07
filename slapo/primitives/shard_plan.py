"""The plan of one ``shard`` call: which tensors are sliced, along which axis, and which modules'
shard records change.

``plan_shard`` resolves the call's names to tensors and their owners and validates everything
(arguments, axes, divisibility, earlier shards, the owners' rules, attention heads) without
changing anything; ``Shard.apply`` (:mod:`slapo.primitives.shard`) then applies the returned
:class:`ShardPlan`. So a call that raises leaves the model and the schedule as they were.
"""

from __future__ import annotations

import dataclasses
from typing import (Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Set, Tuple,
                    Union)

import torch
from torch import nn

from ..errors import ShardError
from ..sharding.layout import ShardInfo
from ..sharding.rules import RuleViolation, head_rule_for, rule_for
from ..sharding.spec import ShardSpec, get_shard_spec
from .module_checks import closest, format_call

__all__ = ["ShardCall", "TensorShard", "OwnerShard", "ShardPlan", "plan_shard", "tensor_owners"]

Owner = Tuple[str, nn.Module, str]  # (module path from the root, module, tensor attribute)


def tensor_owners(root: nn.Module, tensor: torch.Tensor) -> List[Owner]:
    """Every ``(path, module, name)`` in ``root`` holding exactly ``tensor`` (tied weights)."""
    out: List[Owner] = []
    for path, mod in root.named_modules(remove_duplicate=False):
        for name, t in list(mod._parameters.items()) + list(mod._buffers.items()):
            if t is tensor and all(m is not mod or n != name for _, m, n in out):
                out.append((path, mod, name))
    return out


@dataclasses.dataclass(frozen=True)
class ShardCall:
    """The checked arguments of one ``shard`` call, and how errors about it are worded."""

    names: Tuple[str, ...]  # (possibly dotted) tensor names relative to the schedule's module
    axis: int  # as given (may be negative; each owner's rule interprets it)
    fused: int  # number of equal blocks concatenated along the axis
    path: str  # the schedule's path, named by every error
    module: nn.Module  # the schedule's module, described when an error has no better one
    text: str  # the call as written, e.g. "shard('weight', axis=0)"

    def error(self, what: str, hint: str, mod: Optional[nn.Module] = None) -> ShardError:
        """A :class:`ShardError` about this call (on ``mod``, default the schedule's module)."""
        return ShardError(what, path=self.path, call=self.text, module=mod or self.module,
                          hint=hint)


@dataclasses.dataclass(frozen=True)
class TensorShard:
    """One tensor to slice, once, for every module attribute holding it."""

    tensor: torch.Tensor  # the whole tensor as it is now
    axis: int  # non-negative tensor axis, as the owner's rule mapped the call's axis
    owners: Tuple[Owner, ...]  # every (path, module, attribute) holding it: tied weights

    @property
    def global_shape(self) -> Tuple[int, ...]:
        """The shape before sharding (recorded in the new tensor's ``ShardSpec``)."""
        return tuple(self.tensor.shape)


@dataclasses.dataclass(frozen=True)
class OwnerShard:
    """One module whose :class:`~slapo.sharding.layout.ShardInfo` this call extends."""

    path: str  # the module's path from the root
    module: nn.Module
    axes: Mapping[str, int]  # tensor attribute -> axis, for the attributes this call slices
    named: FrozenSet[str]  # those of ``axes`` the call named (the others: tied partners)


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """Everything one validated ``shard`` call changes, in the order it changes it."""

    call: ShardCall
    world_size: int  # of the schedule's tensor-parallel group
    rank: int  # this rank in that group: it keeps chunk ``rank`` (of every fused block)
    tensors: Tuple[TensorShard, ...]  # to slice, each once
    owners: Tuple[OwnerShard, ...]  # whose records and attributes change, first reached first
    # (owner path, attribute) already sharded along the same axis through a tied partner:
    # nothing is sliced, the attribute is only recorded as named on that owner.
    tie_marks: Tuple[Tuple[str, str], ...] = ()


def plan_shard(sch, names: Union[str, Sequence[str]], axis: int, fused: int) -> ShardPlan:
    """Resolve and validate ``shard(names, axis, fused=fused)`` on ``sch``; change nothing.

    Raises:
        ShardError: see :meth:`slapo.primitives.shard.Shard.apply`.
    """
    call = _check_call(sch, names, axis, fused)
    ws = sch.world_size
    tensors: Dict[int, TensorShard] = {}  # by id: a tensor reached twice is sliced once
    named: Set[Tuple[int, str]] = set()  # (id(module), attribute) named by this call
    tie_marks: List[Tuple[str, str]] = []
    for full_name in call.names:
        owner, leaf, tensor, ax, owner_path = _locate(sch, call, full_name)
        spec = get_shard_spec(tensor)
        if spec is not None:
            if _sharded_through_tie(sch, call, full_name, owner, leaf, spec, ax, owner_path):
                tie_marks.append((owner_path, leaf))
            continue
        _check_divisible(sch, call, tensor.shape[ax], ws, owner)
        tensors[id(tensor)] = TensorShard(tensor, ax,
                                          tuple(tensor_owners(sch.root.mod, tensor)))
        named.add((id(owner), leaf))
    plan = ShardPlan(call, ws, sch.rank, tuple(tensors.values()),
                     _owners_of(tensors.values(), named), tuple(tie_marks))
    _check_owners(sch, plan)
    return plan


def _check_call(sch, names, axis, fused) -> ShardCall:
    """Check the argument types; the :class:`ShardCall` with ``names`` as a tuple."""
    names_list = [names] if isinstance(names, str) else list(names) \
        if isinstance(names, (list, tuple)) else None
    text = format_call("shard", names, axis=axis, **({"fused": fused} if fused != 1 else {}))
    call = ShardCall(tuple(names_list or ()), axis, fused, sch.path, sch.mod, text)
    if not names_list or not all(isinstance(n, str) for n in names_list):
        raise call.error(f"names must be a str or a list of str, got {names!r}",
                         "e.g. shard('weight', axis=0) or shard(['weight', 'bias'], axis=0)")
    if len(set(names_list)) != len(names_list):
        raise call.error(f"names {names_list} contain duplicates", "name each tensor once")
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise call.error(f"axis must be an int, got {axis!r}", "e.g. axis=0")
    if not isinstance(fused, int) or isinstance(fused, bool) or fused < 1:
        raise call.error(f"fused must be a positive int, got {fused!r}",
                         "fused=3 for a fused q/k/v projection, else leave it out")
    return call


def _locate(sch, call: ShardCall, full_name: str):
    """``(owner module, attribute, tensor, axis, owner path)`` of one name; the axis is the
    owner rule's non-negative tensor axis for the call's axis."""
    prefix, _, leaf = full_name.rpartition(".")
    try:
        owner = sch.mod.get_submodule(prefix) if prefix else sch.mod
    except AttributeError:
        owner = None
    tensor = None if owner is None else owner._parameters.get(leaf, owner._buffers.get(leaf))
    if tensor is None:
        known = [n for n, _ in sch.mod.named_parameters()] + \
            [n for n, _ in sch.mod.named_buffers()]
        raise call.error(f"no parameter or buffer named '{full_name}'", closest(full_name, known))
    axis = call.axis
    ax = axis + tensor.dim() if -tensor.dim() <= axis < 0 else axis
    try:
        ax = rule_for(owner).tensor_axis(owner, leaf, tensor, ax)
    except RuleViolation as v:
        raise call.error(v.what, v.hint, owner) from None
    if not 0 <= ax < tensor.dim():
        raise call.error(f"axis {axis} is out of range for '{full_name}' of shape "
                         f"{tuple(tensor.shape)}", f"use an axis in 0..{tensor.dim() - 1}", owner)
    owner_path = f"{sch.path}.{prefix}".strip(".") if prefix else sch.path
    return owner, leaf, tensor, ax, owner_path


def _sharded_through_tie(sch, call: ShardCall, full_name: str, owner: nn.Module, leaf: str,
                         spec: ShardSpec, ax: int, owner_path: str) -> bool:
    """For a tensor sharded already: whether it was sharded along ``ax`` through a tied partner
    and should be recorded as named on its owner (sharding it again is then a no-op).

    Raises:
        ShardError: it was sharded along another axis, or named by an earlier call.
    """
    info = sch.root[owner_path].metadata.get("shard")
    if spec.axis == ax and (info is None or leaf not in info.named):
        return info is not None
    raise call.error(f"'{full_name}' is already sharded (axis {spec.axis}, "
                     f"{spec.world_size} ranks)", "shard each tensor once", owner)


def _check_divisible(sch, call: ShardCall, size: int, ws: int, owner: nn.Module) -> None:
    """The sharded dimension must split into ``ws`` equal chunks of every fused block."""
    fused = call.fused
    if size % (ws * fused) == 0:
        return
    what = (f"{size} is not divisible by the tensor-parallel size {ws}" if fused == 1
            else f"{size} is not divisible by {fused} fused parts x tensor-parallel size {ws}")
    hint = _vocab_hint(sch, size, ws) or (
        f"choose a tensor-parallel size that divides {size // fused}, or pad that dimension to "
        f"a multiple of {ws * fused}")
    raise call.error(what, hint, owner)


def _vocab_hint(sch, size: int, ws: int) -> Optional[str]:
    config = getattr(sch.root.mod, "config", None)
    if getattr(config, "vocab_size", None) == size:
        return f"pad vocab_size to a multiple of {ws}"
    return None


def _owners_of(tensors: Iterable[TensorShard],
               named: Set[Tuple[int, str]]) -> Tuple[OwnerShard, ...]:
    """The modules holding ``tensors``, first reached first, each with its new attribute ->
    axis entries and which of them the call named."""
    axes: Dict[int, Tuple[str, nn.Module, Dict[str, int]]] = {}
    for shard in tensors:
        for opath, omod, oname in shard.owners:
            axes.setdefault(id(omod), (opath, omod, {}))[2][oname] = shard.axis
    return tuple(OwnerShard(opath, omod, new, frozenset(n for n in new if (id(omod), n) in named))
                 for opath, omod, new in axes.values())


def _check_owners(sch, plan: ShardPlan) -> None:
    """Each owner's rule accepts its tensors' axes (earlier shards included), and a column
    shard of an attention head projection splits whole heads."""
    for owner in plan.owners:
        node = sch.root[owner.path]
        info = node.metadata.get("shard") or ShardInfo()
        rule = rule_for(owner.module)
        try:
            rule.check(owner.module, {**info.tensors, **owner.axes})
            _check_heads(node, owner.module, owner.axes, plan.call.fused, plan.world_size, rule)
        except RuleViolation as v:
            raise plan.call.error(v.what, v.hint, owner.module) from None


def _check_heads(node, mod: nn.Module, new: Mapping[str, int], fused: int, ws: int,
                 rule) -> None:
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
