"""Mixture-of-experts layers under tensor parallelism: the experts sharded, the router replicated.

HF's MoE blocks (Mixtral, Qwen3-MoE, DeepSeek-V3 and most other transformers 5 families) call a
router (``gate``: a ``weight [E, H]``; softmax or sigmoid, top-k) and then an experts module
holding every expert as one 3-D tensor per projection::

    experts(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]
    gate_up_proj [E, 2*I, H]  (gate and up packed along axis 1)     down_proj [E, H, I]

(``is_transposed`` experts store ``[E, H, 2*I]`` / ``[E, I, H]``; experts without a gate hold
``up_proj``.) Two functions turn the plan entries of such a layer into Slapo primitives.

:func:`shard_experts` (plan style ``moe_tp_experts`` on the experts module):

* ``expert_parallel=False`` -- **tensor parallelism inside every expert**: each rank holds every
  expert, with ``1/n`` of its intermediate dimension. The sub-entries say which tensor is split
  where; what each style becomes (``shard`` calls on the experts module):

  ==================================  ==========================================================
  sub-entry style                     becomes
  ==================================  ==========================================================
  ``packed_colwise`` / ``colwise``    ``shard(name, axis=1)``: the output axis of ``[E, out, in]``
  ``packed_rowwise`` / ``rowwise``    ``shard(name, axis=2)``: the input axis of ``[E, out, in]``
  ==================================  ==========================================================

  The axis a style names must be the expert's intermediate axis (else: ``ConfigError``, the plan
  would split the hidden axis). Packing follows the module's layout, not the style's name: a
  concatenated ``gate|up`` tensor is always sharded with ``fused=2`` (each rank keeps its slice
  of the gate block *and* of the up block), an interleaved one (``is_concatenated=False``) as
  one slice. A plain ``colwise`` on a concatenated tensor (as inkling's plan writes) would put
  all gate rows on one rank and all up rows on the other. Then the module's output (a partial
  sum) is all-reduced (``sync("fwd_post", "all_reduce")``) and the gradients of both of its
  float inputs, ``hidden_states`` and ``top_k_weights``, are all-reduced in backward
  (``sync("fwd_pre", RoutedInputGradAllReduce)``: both are partial, and the router's gradient
  arrives through ``top_k_weights``).
* ``expert_parallel=True`` -- **expert parallelism**: each rank holds ``E / n`` whole experts
  (``ConfigError`` when ``n`` does not divide ``E``); the experts module is replaced
  (``replace``) by a copy of itself holding only its local experts under the *same parameter
  names* (each tensor sharded on its expert axis 0, with a ``ShardSpec``, so checkpoints and
  ``verify`` map it to the full tensor), whose forward routes tokens to their experts' owners
  with all-to-all (:class:`slapo.sharding.expert_parallel.ExpertParallelForward`: each rank
  dispatches ``1/n`` of the tokens, the results come back and are combined with the router's
  weights on the token's rank, and the token shards are all-gathered). The plan's sub-entries
  are checked but do not apply (whole experts are not split).

Dense-routed experts (Llama 4's ``Llama4TextExperts``: one input ``[E * T, H]``, every expert
on its row block, ``[E, in, out]`` tensors without HF's flags) take both forms too, through
:mod:`.moe_dense` (checked on a probe of their own forward first; no all-to-all needed).

Refused (``ConfigError`` naming the path, with a hint): sequence parallelism (the MoE block's
input would be a sequence chunk: not supported yet); under tensor parallelism inside the experts,
expert biases (the down projection's bias would be added on every rank) and a post-expert norm
(a norm of partial sums) -- use ``expert_parallel=True`` for those; parameters of the experts
module outside its expert tensors; plan entries that name no tensor of the module, unknown
styles, and a plan that splits one expert tensor but not the other.

:func:`replicate_router` (the router / ``gate``): its weights stay whole on every rank. With
both forms above, the router runs on every token on every rank and the gradient that reaches it
through ``top_k_weights`` is complete, so its weight gradient is already the full one: nothing is
added. Only when its input is a shard (``sharded_input=True``: each rank routes different
tokens) its parameters are marked replicated (``mark_replicated``) and their gradients are
summed over the group in backward by the ``all_reduce_grads`` hooks (no call in the loop).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Dict, List, Mapping, Optional, Tuple

from torch import nn

from ..errors import ConfigError
from ..primitives.annotate import copy_param_tags
from ..primitives.module_checks import closest
from ..runtime.forward_wrap import install_forward_wrapper
from ..schedule import Schedule
from ..sharding.expert_parallel import ExpertParallelForward, RoutedInputGradAllReduce
from ..sharding.layout import REPLICATED, ModuleLayout, ShardInfo
from ..sharding.sequence_parallel import mark_replicated
from ..sharding.spec import SHARD_ATTR, ShardSpec, get_shard_spec, set_shard_spec
from . import moe_dense
from .common import TPMode
from .config import ScheduleConfig

__all__ = ["EXPERTS_STYLE", "ExpertsLayout", "shard_experts", "replicate_router", "check_experts",
           "check_router"]

logger = logging.getLogger(__name__)

EXPERTS_STYLE = "moe_tp_experts"
_STYLE_AXIS = {"colwise": 1, "packed_colwise": 1, "rowwise": 2, "packed_rowwise": 2}


@dataclasses.dataclass(frozen=True)
class ExpertsLayout:
    """Where the intermediate axis of each expert tensor of an experts module is.

    ``axes``: expert tensor name -> its intermediate axis (``gate_up_proj``/``up_proj``: the
    output axis, ``down_proj``: the input axis; swapped for ``is_transposed`` experts);
    ``fused``: name -> 2 for a concatenated ``gate|up`` tensor, else 1; ``num_experts``: E.
    """

    axes: Dict[str, int]
    fused: Dict[str, int]
    num_experts: int
    has_bias: bool
    has_post_norm: bool
    transposed: bool = False
    dense: bool = False

    @classmethod
    def of(cls, mod: nn.Module, path: str) -> "ExpertsLayout":
        """The layout of experts module ``mod``: HF's ``use_experts_implementation`` flags, or
        for experts without them (Llama 4's dense-routed ones, :mod:`.moe_dense`) the layout
        read from the tensors' shapes and the hidden size."""
        up = "gate_up_proj" if getattr(mod, "gate_up_proj", None) is not None else "up_proj"
        names = [n for n in (up, "down_proj") if isinstance(getattr(mod, n, None), nn.Parameter)]
        if len(names) != 2 or any(getattr(mod, n).dim() != 3 for n in names):
            raise _error(path, mod, "is not an experts module with 3-D expert tensors "
                         "(gate_up_proj or up_proj, and down_proj)",
                         f"'{EXPERTS_STYLE}' applies to HF experts modules; check the plan's path")
        transposed = bool(getattr(mod, "is_transposed", False))
        if not hasattr(mod, "is_transposed"):
            inferred = moe_dense.transposed_from_shapes(mod, up)
            transposed = transposed if inferred is None else inferred
        out_axis, in_axis = (2, 1) if transposed else (1, 2)
        packed = up == "gate_up_proj" and bool(getattr(mod, "is_concatenated", True))
        num_experts = getattr(mod, up).shape[0]
        return cls(axes={up: out_axis, "down_proj": in_axis},
                   fused={up: 2 if packed else 1, "down_proj": 1}, num_experts=num_experts,
                   has_bias=bool(getattr(mod, "has_bias", False)),
                   has_post_norm=bool(getattr(mod, "has_post_expert_norm", False)),
                   transposed=transposed, dense=moe_dense.dense_routed(mod))


def _error(path: str, mod: nn.Module, what: str, hint: str) -> ConfigError:
    return ConfigError(what, path=path, call="shard_experts", module=mod, hint=hint)


def shard_experts(sch: Schedule, path: str, cfg: ScheduleConfig, mode: TPMode,
                  plan: Mapping[str, str], *, expert_parallel: bool) -> None:
    """Shard the experts module at ``path`` over ``sch.group`` (the module docstring says what
    each form does); ``plan`` holds the resolved plan sub-entries below ``path``
    (``{"gate_up_proj": "packed_colwise", "down_proj": "rowwise"}``; empty: the split follows
    the module's layout alone). ``cfg`` is the schedule's knobs (read by nothing here yet).
    Nothing happens without tensor parallelism (``mode.tp`` False).

    Raises:
        ConfigError: see the module docstring ("Refused").
    """
    if not mode.tp:
        return
    layout = check_experts(sch, path, mode, plan, expert_parallel=expert_parallel)
    assert layout is not None  # mode.tp
    if layout.dense:
        moe_dense.shard_dense_experts(sch, path, layout.axes, layout.fused,
                                      expert_parallel=expert_parallel)
    elif expert_parallel:
        _expert_parallel(sch, path, layout)
    else:
        _tensor_parallel(sch, path, layout)


def check_experts(sch: Schedule, path: str, mode: TPMode, plan: Mapping[str, str], *,
                  expert_parallel: bool) -> Optional[ExpertsLayout]:
    """Everything :func:`shard_experts` refuses, checked without changing anything; returns
    the experts' layout (``None`` without tensor parallelism).

    Raises:
        ConfigError: see the module docstring ("Refused").
    """
    if not mode.tp:
        return None
    mod = sch[path].mod
    if mode.sp:
        raise _error(path, mod, "sequence parallelism is not supported for mixture-of-experts "
                     "layers", "drop sequence_parallel=True for this model")
    layout = ExpertsLayout.of(mod, path)
    if layout.dense:
        moe_dense.check_dense_form(path, mod, layout.transposed)
    _check_plan(mod, path, layout, plan)
    _check_extra_params(mod, path, layout)
    if expert_parallel:
        _check_expert_parallel(sch, path, layout)
    else:
        _check_tensor_parallel(sch, path, layout)
    return layout


def _check_plan(mod: nn.Module, path: str, layout: ExpertsLayout,
                plan: Mapping[str, str]) -> None:
    """Each entry names an expert tensor of ``mod`` with a known style whose axis is the
    tensor's intermediate axis; a non-empty plan names every expert tensor."""
    names = [n for n, _ in mod.named_parameters(recurse=False)]
    for name, style in plan.items():
        if name not in layout.axes:
            near = closest(name, names)
            raise _error(path, mod, f"the plan entry '{path}.{name}' names no expert tensor of "
                         f"this module (it has {', '.join(names)})",
                         (f"did you mean '{near}'? " if near else "")
                         + "plan entries below the experts name its 3-D tensors")
        if style not in _STYLE_AXIS:
            raise _error(path, mod, f"the plan style {style!r} of '{path}.{name}' is unknown "
                         "for an expert tensor", f"use one of {', '.join(_STYLE_AXIS)}")
        if _STYLE_AXIS[style] != layout.axes[name]:
            shape = tuple(getattr(mod, name).shape)
            raise _error(path, mod, f"'{path}.{name}' {shape}: {style!r} splits axis "
                         f"{_STYLE_AXIS[style]}, but its intermediate axis is "
                         f"{layout.axes[name]} (the plan would split the hidden size)",
                         "fix the plan entry: colwise for the output axis of [E, out, in], "
                         "rowwise for its input axis")
    missing = [n for n in layout.axes if n not in plan]
    if plan and missing:
        raise _error(path, mod, f"the plan splits {', '.join(sorted(plan))} but not "
                     f"{', '.join(missing)}: the experts' intermediate dimension must be split "
                     "in every tensor or in none", f"add plan entries for {', '.join(missing)}")


def _check_extra_params(mod: nn.Module, path: str, layout: ExpertsLayout) -> None:
    extra = [n for n, _ in mod.named_parameters() if n not in layout.axes]
    if extra:
        raise _error(path, mod, f"the experts module has parameters besides its expert tensors "
                     f"({', '.join(extra)}), which neither form of sharding handles yet",
                     "leave this layer unsharded, or shard the experts by hand")


def _check_tensor_parallel(sch: Schedule, path: str, layout: ExpertsLayout) -> None:
    node = sch[path]
    if layout.has_bias or layout.has_post_norm:
        what = "biases" if layout.has_bias else "a post-expert norm"
        raise _error(path, node.mod, f"the experts have {what}, which tensor parallelism inside "
                     "the experts would apply to partial sums on every rank",
                     "use expert_parallel=True (whole experts per rank)")
    for name, axis in layout.axes.items():
        size = getattr(node.mod, name).shape[axis] // layout.fused[name]
        if size % sch.world_size:
            raise _error(path, node.mod, f"the experts' intermediate size {size} is not "
                         f"divisible by the tensor-parallel size {sch.world_size}",
                         f"use a tensor-parallel size that divides {size}, or "
                         "expert_parallel=True")


def _tensor_parallel(sch: Schedule, path: str, layout: ExpertsLayout) -> None:
    node = sch[path]
    for name, axis in layout.axes.items():
        node.shard(name, axis=axis, **({"fused": 2} if layout.fused[name] == 2 else {}))
    node.sync("fwd_pre", RoutedInputGradAllReduce(sch.group, path))
    node.sync("fwd_post", "all_reduce")


def _check_expert_parallel(sch: Schedule, path: str, layout: ExpertsLayout) -> None:
    node = sch[path]
    mod, ws, num = node.mod, sch.world_size, layout.num_experts
    if num % ws:
        raise _error(path, mod, f"{num} experts cannot be split over {ws} ranks (expert "
                     f"parallelism gives each rank E / {ws} whole experts)",
                     f"use a tensor-parallel size that divides {num}, or "
                     "expert_parallel=False (tensor parallelism inside the experts)")
    if not layout.dense and getattr(mod, "num_experts", None) != num:
        raise _error(path, mod, f"the experts module has no attribute num_experts == {num}, "
                     "which its forward must read to run only the local experts",
                     "use expert_parallel=False for this family")
    already = [n for n, p in mod.named_parameters() if get_shard_spec(p) is not None]
    if already:
        raise _error(path, mod, f"{', '.join(already)} are already sharded",
                     "shard the experts once (expert_parallel=True or False, not both)")


def _expert_parallel(sch: Schedule, path: str, layout: ExpertsLayout) -> None:
    node = sch[path]
    mod, num = node.mod, layout.num_experts
    node.replace(_local_experts(sch, mod, layout))
    sch[path].metadata["shard"] = ShardInfo(
        tensors={n: 0 for n in _expert_tensors(sch[path].mod, num)},
        layout=ModuleLayout(REPLICATED, REPLICATED))


def _expert_tensors(mod: nn.Module, num_experts: int) -> List[str]:
    return [n for n, t in [*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False)]
            if t.dim() > 0 and t.shape[0] == num_experts]


def _local_experts(sch: Schedule, mod: nn.Module, layout: ExpertsLayout) -> nn.Module:
    """A copy of ``mod`` (sharing its config and activation) holding only this rank's experts,
    under the same names, with the all-to-all forward wrapper installed."""
    ws, rank, num = sch.world_size, sch.rank, layout.num_experts
    shared = {id(p): p for p in mod.parameters()}
    for attr in ("config", "act_fn"):
        if getattr(mod, attr, None) is not None:
            shared[id(getattr(mod, attr))] = getattr(mod, attr)
    new = copy.deepcopy(mod, memo=shared)
    for name in _expert_tensors(mod, num):
        full = getattr(mod, name)
        spec = ShardSpec(0, ws, rank, tuple(full.shape))
        local = spec.slice_of(full.detach())
        if isinstance(full, nn.Parameter):
            local = nn.Parameter(local, requires_grad=full.requires_grad)
            copy_param_tags(full, local, sch.param_tags)
        set_shard_spec(local, spec)
        store = new._parameters if name in new._parameters else new._buffers
        store[name] = local
    sch.param_tags.add(SHARD_ATTR)
    new.num_experts = num // ws
    install_forward_wrapper(new, "expert_parallel", ExpertParallelForward(num, sch.group))
    return new


def replicate_router(sch: Schedule, path: str, *, sharded_input: bool = False) -> None:
    """Keep the router at ``path`` whole on every rank (module docstring). Its gradient is
    complete when every rank routes the same tokens (both forms of :func:`shard_experts`):
    nothing is added. ``sharded_input=True`` (each rank routes a different shard of the tokens)
    marks its parameters replicated (``mark_replicated``), so their gradients are summed over
    the group in backward by the ``all_reduce_grads`` hooks.

    Raises:
        ConfigError: the router has no parameters, or some are sharded.
    """
    node = check_router(sch, path)
    if sharded_input:
        mark_replicated(node)
    else:
        logger.debug("router '%s': replicated input, gradient complete; nothing to add", path)


def check_router(sch: Schedule, path: str) -> Schedule:
    """What :func:`replicate_router` refuses, checked without changing anything; returns the
    router's schedule node.

    Raises:
        ConfigError: the router has no parameters, or some are sharded.
    """
    node = sch[path]
    params: List[Tuple[str, nn.Parameter]] = list(node.mod.named_parameters())
    if not params:
        raise ConfigError("the router has no parameters to replicate", path=path,
                          call="replicate_router", module=node.mod,
                          hint="pass the path of the MoE block's router (e.g. 'mlp.gate')")
    sharded = [n for n, p in params if get_shard_spec(p) is not None]
    if sharded:
        raise ConfigError(f"the router's {', '.join(sharded)} are sharded; every rank needs "
                          "the whole router to route its tokens", path=path,
                          call="replicate_router", module=node.mod,
                          hint="remove the shard of the router from the schedule / plan")
    return node
