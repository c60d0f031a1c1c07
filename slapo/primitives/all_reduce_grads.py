"""``all_reduce_grads``: sum the gradients of replicated parameters over the TP group, in
backward (a gradient hook per parameter; :mod:`slapo.sharding.grad_all_reduce`)."""

from __future__ import annotations

from typing import List, Optional, Sequence

from ..errors import ConfigError
from ..sharding.grad_all_reduce import GRAD_ALL_REDUCE_TAG, tag_for_grad_all_reduce
from .module_checks import closest, format_call
from .registry import Primitive, register_primitive

__all__ = ["AllReduceGrads"]


@register_primitive
class AllReduceGrads(Primitive):
    name = "all_reduce_grads"

    @staticmethod
    def apply(sch, names: Optional[Sequence[str]] = None) -> None:
        """Sum the gradients of parameters ``names`` over the schedule's tensor-parallel group,
        inside backward.

        For a parameter kept whole on every rank but used on a shard of the activations (norm
        weights and row-parallel biases under sequence parallelism, Qwen3's per-head
        ``q_norm``/``k_norm`` weights, which see only this rank's heads): each rank's gradient
        is a partial sum. A gradient hook on each parameter all-reduces every gradient
        contribution before it is accumulated, so ``.grad`` is complete with no call in the
        training loop, and gradient accumulation stays correct. ``names`` are relative to this
        module (dotted names reach into children); default: the module's own parameters.
        Calling it again for a parameter is harmless (one hook per parameter). Nothing is
        installed on one rank.

        Before: each rank's ``.grad`` holds its partial gradient. After: the sum over the group.
        The parameter is tagged ``slapo_grad_all_reduce`` (the tag follows re-created
        parameters; ``slapo.build`` re-registers the hook after materialising meta weights).
        Call it after ``shard`` of the same module (the hook is for whole parameters).

        Runtimes: ``torch``, ``deepspeed`` (ZeRO 0-3) and ``megatron`` keep the parameter
        objects, so the hook runs; ``fsdp`` replaces parameters and refuses such a schedule.

        Raises:
            ConfigError: a name that is not a parameter of this module.
        """
        own = dict(sch.mod.named_parameters(recurse=False))
        names = list(own) if names is None else [names] if isinstance(names, str) else list(names)
        params = dict(sch.mod.named_parameters())
        missing = [n for n in names if n not in params]
        if missing:
            raise ConfigError(f"{missing} are not parameters of this module", path=sch.path,
                              call=format_call("all_reduce_grads", names), module=sch.mod,
                              hint=closest(missing[0], params) or
                              f"its parameters: {sorted(params)}")
        previous: List[str] = sch.metadata.get("all_reduce_grads", [])
        sch.metadata["all_reduce_grads"] = list(dict.fromkeys(previous + names))
        if sch.world_size == 1:
            return
        sch.param_tags.add(GRAD_ALL_REDUCE_TAG)  # shard/materialisation copy the tag
        for name in names:
            tag_for_grad_all_reduce(params[name], sch.group)
