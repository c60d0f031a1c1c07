"""``checkpoint``: activation checkpointing of a module (or of a traced subgraph)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch

from ..runtime.activation_checkpoint import checkpoint_with_policy
from ..runtime.checkpoint_policy import SavePolicy, resolve_policy
from ..errors import CheckpointError
from ..runtime.forward_wrap import has_forward_wrapper, install_forward_wrapper
from .module_checks import format_call
from .registry import Primitive, register_primitive

__all__ = ["Checkpoint", "CheckpointForward", "checkpoint_forward"]


def _is_kv_cache(value: Any) -> bool:
    return type(value).__module__.startswith("transformers.cache_utils")


class CheckpointForward:
    """Forward wrapper of the module at ``path``: run it under RNG-exact checkpointing, keeping
    the outputs of the ops ``policy`` selects (None: none, the whole forward is recomputed)."""

    def __init__(self, path: str, policy: Optional[SavePolicy] = None):
        self.path = path
        self.policy = policy

    def __call__(self, inner: Callable, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and any(_is_kv_cache(v) for v in (*args, *kwargs.values())):
            owner = type(getattr(inner, "args", (None,))[0]).__name__
            raise CheckpointError(
                "the checkpointed module was called with a KV cache; recomputing it in "
                "backward would append to the cache a second time", call="checkpoint()",
                path=self.path, hint=f"train with use_cache=False (e.g. model.config.use_cache "
                f"= False) when checkpointing {owner} layers")
        return checkpoint_with_policy(self.policy, inner, *args, **kwargs)


def checkpoint_forward(inner: Callable, *args: Any, **kwargs: Any) -> Any:
    """Run ``inner`` under RNG-exact checkpointing (for wrappers that know no path)."""
    return CheckpointForward("")(inner, *args, **kwargs)


@register_primitive
class Checkpoint(Primitive):
    name = "checkpoint"
    original_kwargs = {
        "order_args_fn": "drop it: checkpoint() wraps the module's forward in place, so "
                         "positional and keyword arguments reach it unchanged",
    }

    @staticmethod
    def apply(sch, subgraph: Optional[Any] = None, *,
              policy: Optional[Union[str, SavePolicy]] = None) -> Optional[str]:
        """Recompute this module's activations in backward instead of storing them.

        Whole module (``subgraph=None``): the module's forward runs under
        :func:`slapo.checkpoint` (non-reentrant ``torch.utils.checkpoint`` that also restores
        slapo's RNG streams), so positional and keyword arguments both work and dropout draws
        the same masks when recomputed. The module stays where it is: paths, hooks and
        ``state_dict`` keys are unchanged. Subgraph form (on a traced module): the subgraph is
        moved into a new submodule that is checkpointed; see :mod:`slapo.trace.tracer`.

        ``policy`` (whole modules only) makes it selective: the outputs of the ops it names are
        kept and everything else is recomputed. ``"save_matmuls"`` keeps every linear layer's
        matmul and the fused attention kernels' outputs, ``"save_every_other_matmul"`` every
        second matmul and the attention outputs (torchtitan's selective "op" checkpointing),
        or a :class:`slapo.SavePolicy`. Random ops are always recomputed (RNG-exact);
        :mod:`slapo.runtime.checkpoint_policy`.

        Before: activations of the module are kept for backward. After: only its inputs are
        (with a policy: its inputs and the selected ops' outputs).
        Returns the new submodule's name in the subgraph form, else None.

        Raises:
            CheckpointError: the module is already checkpointed; an unknown policy; a policy
                with a subgraph.
        """
        if subgraph is not None:
            if policy is not None:
                raise CheckpointError(
                    "a selective policy applies to a whole module, not to a subgraph",
                    path=sch.path, call=format_call("checkpoint", subgraph, policy=policy),
                    module=sch.mod, hint="checkpoint the subgraph without a policy, or call "
                    "checkpoint(policy=...) on the module that runs it")
            from .subgraph_replace import checkpoint_subgraph  # provided with trace-by-need

            return checkpoint_subgraph(sch, subgraph)
        call = format_call("checkpoint", **({} if policy is None else {"policy": policy}))
        save = None if policy is None else resolve_policy(policy, call=call, path=sch.path,
                                                           module=sch.mod)
        if has_forward_wrapper(sch.mod, "checkpoint"):
            raise CheckpointError("the module is already checkpointed", path=sch.path,
                                  call=call, module=sch.mod,
                                  hint="call checkpoint() once per module")
        install_forward_wrapper(sch.mod, "checkpoint", CheckpointForward(sch.path, save))
        sch.metadata["checkpoint"] = True
        if save is not None:
            sch.metadata["checkpoint_policy"] = save
        return None
