"""The ``fsdp`` target: the scheduled model under PyTorch's FSDP2 (``fully_shard``).

``build(sch, target="fsdp", optimizer=None, layers=None, mesh=None, mixed_precision=None,
reshard_after_forward=True)`` returns ``(model, optimizer)``; train it with the plain loop
(``model(**batch).loss.backward(); opt.step(); opt.zero_grad()``): FSDP2 gathers each unit's
parameters before its forward and backward and reduce-scatters (averages) the gradients over the
data-parallel ranks.

* **Units**: one ``fully_shard`` per layer, then one for the root (what is left: embeddings, the
  head, final norms). ``layers`` are the schedule's layer list (:func:`layer_units`): the items of
  the model's outermost layer stacks (every ``nn.ModuleList``, and every ``nn.Sequential`` of
  blocks of one class, as WideResNet's ``layer1..4``), unless given as explicit paths. A layer
  that shares a parameter with a module outside it (a tied weight) is left to the root unit, so
  the tie is kept: one parameter, one unit.
* **TP x FSDP**: when the schedule is tensor parallel (its group has more than one rank and
  parameters are sharded), FSDP shards over the *data-parallel* ranks only, the ranks holding the
  same tensor-parallel position (:func:`~slapo.dialects.common.data_parallel_group`): a 2-D
  (DP, TP) layout with Slapo's own collectives on the TP axis, FSDP's on the DP axis. Without TP,
  FSDP shards over the world. ``mesh`` (a 1-D ``DeviceMesh``) overrides the data-parallel mesh.
* ``reshard_after_forward``: free each unit's gathered parameters after its forward (ZeRO-3
  style; the last layer keeps them, it is the first the backward needs); ``False`` keeps them
  all until the backward (ZeRO-2 style: more memory, one all-gather per step fewer per unit).
* ``mixed_precision``: a dtype (e.g. ``torch.bfloat16``): FSDP2 computes in it and reduces
  gradients in fp32, keeping fp32 master weights (``MixedPrecisionPolicy``).
* ``optimizer``: as for ``torch`` (factory ``fn(params)`` or an optimizer); default AdamW. It is
  created over the sharded (DTensor) parameters, after wrapping.

* **Gradient all-reduces over TP** (``all_reduce_grads``; sequence parallelism's norms and
  biases, Qwen3's q/k norms): FSDP2 replaces those parameters, so their gradient hooks are
  re-registered on the parameters FSDP2 gathers for forward and backward; their gradients are
  summed over the TP group inside backward, then reduce-scattered over the data-parallel
  ranks. ``model.slapo_tp_reduced_params`` lists them.

Pipeline cuts are refused (use ``torch`` or ``deepspeed``).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..errors import BuildError
from ..runtime.distributed import init_distributed
from ..sharding.grad_all_reduce import GRAD_ALL_REDUCE_TAG, tag_for_grad_all_reduce
from .common import (OptimizerArg, data_parallel_group, has_tp_shards, make_optimizer,
                     reject_pipeline_cuts, tp_ranks)
from .registry import Dialect, register_dialect

__all__ = ["FSDPDialect", "layer_units", "data_parallel_mesh"]

_CALL = "build(target='fsdp')"


def _is_stack(mod: nn.Module) -> bool:
    """A stack of layers: a ModuleList, or a Sequential whose items share one non-torch class."""
    if isinstance(mod, nn.ModuleList):
        return len(mod) > 0
    if type(mod) is nn.Sequential and len(mod) > 0:
        kinds = {type(m) for m in mod}
        (kind,) = kinds if len(kinds) == 1 else (None,)
        return kind is not None and not kind.__module__.startswith("torch.nn")
    return False


def _stack_items(model: nn.Module) -> List[str]:
    """Paths of the items of the outermost layer stacks, in module order."""
    found: List[str] = []

    def visit(mod: nn.Module, path: str) -> None:
        for name, child in mod.named_children():
            child_path = f"{path}.{name}" if path else name
            if _is_stack(child):
                found.extend(f"{child_path}.{i}" for i, _ in child.named_children())
            else:
                visit(child, child_path)

    visit(model, "")
    return found


def _tied_outside(model: nn.Module, path: str) -> bool:
    """Whether a parameter of the module at ``path`` is also owned by a module outside it."""
    inside = {id(p) for p in model.get_submodule(path).parameters()}
    prefix = path + "."
    return any(id(p) in inside for name, p in model.named_parameters(remove_duplicate=False)
               if not name.startswith(prefix))


def layer_units(model: nn.Module, layers: Optional[Sequence[str]] = None) -> List[str]:
    """The paths that get their own ``fully_shard``: ``layers`` (checked), else the items of the
    model's outermost layer stacks; layers with tied parameters shared outside are dropped (they
    stay in the root unit).

    Raises:
        BuildError: an explicit path that is not a module of the model.
    """
    names = dict(model.named_modules())
    if layers is None:
        layers = _stack_items(model)
    else:
        missing = [p for p in layers if p not in names or p == ""]
        if missing:
            from ..primitives.module_checks import closest

            raise BuildError(f"layers {missing} are not module paths of the model", call=_CALL,
                             hint=closest(missing[0], list(names)) or
                             "pass paths from model.named_modules(), e.g. 'transformer.h.0'")
    return [p for p in layers if not _tied_outside(model, p)]


def data_parallel_mesh(sch, model: nn.Module, device: torch.device):
    """The 1-D ``DeviceMesh`` FSDP shards over: the world, or with tensor parallelism the ranks
    that hold the same tensor-parallel position (collective over the world)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if len(tp_ranks(sch.group)) > 1 and has_tp_shards(model):
        group = data_parallel_group(sch.group)
        return DeviceMesh.from_group(group, device.type)
    return init_device_mesh(device.type, (dist.get_world_size(),))


class _ReattachGradHook:
    """Forward pre-hook of a module that owns a parameter tagged for a gradient all-reduce
    over the tensor-parallel group (``all_reduce_grads``, sequence parallelism's norms and
    biases, Qwen3's q/k norms).

    FSDP2 replaces the tagged parameter by a DTensor shard, and, for every forward and
    backward, by an unsharded parameter it gathers (one object, kept across steps), so the
    hook registered on the original is lost. Running after FSDP2's own pre-forward (which puts
    the unsharded parameter on the module), this registers the same all-reduce on the
    unsharded parameter, once: each gradient contribution is summed over the TP group inside
    backward, before FSDP2 accumulates it and reduce-scatters it over the data-parallel
    ranks (the two reductions are over different ranks, so neither needs the other's).
    Gradients are complete after backward, and gradient accumulation stays right."""

    def __init__(self, name: str, group: Any):
        self.name, self.group = name, group

    def __call__(self, module: nn.Module, args: Any) -> None:
        param = module._parameters.get(self.name)
        if param is not None and not hasattr(param, "to_local"):  # gathered, not a shard
            tag_for_grad_all_reduce(param, self.group)


def _keep_grad_hooks(model: nn.Module) -> List[str]:
    """Give every module owning a tagged parameter a :class:`_ReattachGradHook` (call before
    ``fully_shard``: it reads the tags FSDP2 drops; FSDP2's pre-forward is prepended, so it
    still runs first). Returns the tagged parameters' paths."""
    tagged = []
    for mod_path, mod in model.named_modules():
        for name, param in mod._parameters.items():
            hook = getattr(param, GRAD_ALL_REDUCE_TAG, None) if param is not None else None
            if hook is not None:
                mod.register_forward_pre_hook(_ReattachGradHook(name, hook.group))
                tagged.append(f"{mod_path}.{name}" if mod_path else name)
    return tagged


@register_dialect
class FSDPDialect(Dialect):
    """``build(sch, target="fsdp", optimizer=None, layers=None, mesh=None,
    mixed_precision=None, reshard_after_forward=True)`` -> ``(model, optimizer)``; see the
    module docstring."""

    name = "fsdp"
    options = ("optimizer", "layers", "mesh", "mixed_precision", "reshard_after_forward")

    def build(self, sch, model: nn.Module, optimizer: OptimizerArg = None,
              layers: Optional[Sequence[str]] = None, mesh: Any = None,
              mixed_precision: Optional[torch.dtype] = None,
              reshard_after_forward: bool = True) -> Tuple[nn.Module, Any]:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        reject_pipeline_cuts(sch, self.name)
        if mixed_precision is not None and not isinstance(mixed_precision, torch.dtype):
            raise BuildError(f"mixed_precision must be a torch dtype, got {mixed_precision!r}",
                             call=_CALL, hint="e.g. mixed_precision=torch.bfloat16")
        env = init_distributed()
        model.to(env.device)
        units = layer_units(model, layers)
        tp_reduced = _keep_grad_hooks(model)  # before fully_shard drops the tags
        if mesh is None:
            mesh = data_parallel_mesh(sch, model, env.device)
        kw: dict = dict(mesh=mesh, reshard_after_forward=reshard_after_forward)
        if mixed_precision is not None:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=mixed_precision,
                                                   reduce_dtype=torch.float32)
        for i, path in enumerate(units):
            # the last layer's parameters are the first the backward needs: keep them gathered
            # after its forward (as torchtitan does) instead of resharding and regathering
            last = i == len(units) - 1
            fully_shard(model.get_submodule(path),
                        **{**kw, "reshard_after_forward": reshard_after_forward and not last})
        fully_shard(model, **kw)
        model.slapo_tp_reduced_params = tp_reduced
        model.slapo_fsdp_units = units  # what was wrapped, for tests and explain
        return model, make_optimizer(model, optimizer)
