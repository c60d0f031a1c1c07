"""Gradient hooks that sum a replicated parameter's gradient over the tensor-parallel group.

A parameter kept whole on every tensor-parallel rank but used on a *shard* of the activations
(a norm weight under sequence parallelism, Qwen3's per-head ``q_norm``, a router fed a sequence
chunk) gets only a partial gradient on each rank. :func:`tag_for_grad_all_reduce` tags such a
parameter (attribute ``slapo_grad_all_reduce``, holding the :class:`GradAllReduce` hook) and
registers the hook on it: every gradient contribution is all-reduced *inside* backward, before
it is accumulated into ``.grad``, so no call is needed in the training loop and gradient
accumulation stays correct. The ``all_reduce_grads`` primitive and ``mark_replicated`` use it.

Tensor hooks live on the tensor object, so they do not follow a parameter that a runtime or a
build step re-creates (materialising meta weights, ``copy.deepcopy``); the tag does (``shard``
and materialisation copy annotated attributes). :func:`install_grad_hooks` re-registers the hook
of every tagged parameter that lacks it (``slapo.build`` calls it after materialising), and
:func:`grad_hook_installed` tells whether a given tensor's gradient is reduced by its hook (so
``reduce_replicated_grads`` never reduces it a second time).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["GRAD_ALL_REDUCE_TAG", "GradAllReduce", "tag_for_grad_all_reduce",
           "grad_hook_installed", "install_grad_hooks"]

GRAD_ALL_REDUCE_TAG = "slapo_grad_all_reduce"


class GradAllReduce:
    """Tensor hook: the gradient summed over ``group`` (a new tensor; the input is untouched).

    A module-level class (not a closure) so that it can be compared, found again on a tensor
    and shared by copies (``copy.deepcopy`` returns the same hook: a process group is not
    copyable, and the copy reduces over the same group)."""

    def __init__(self, group: Optional[dist.ProcessGroup]):
        self.group = group

    def __call__(self, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad, group=self.group)
        return grad

    def __deepcopy__(self, memo: dict) -> "GradAllReduce":
        return self

    def __repr__(self) -> str:
        return "GradAllReduce()"


def grad_hook_installed(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s own gradient hooks include its tagged :class:`GradAllReduce` (its
    gradient is then complete after backward)."""
    hook = getattr(tensor, GRAD_ALL_REDUCE_TAG, None)
    hooks = getattr(tensor, "_backward_hooks", None) or {}
    return hook is not None and any(h is hook for h in hooks.values())


def _register(param: torch.Tensor) -> bool:
    if not param.requires_grad or grad_hook_installed(param):
        return False
    param.register_hook(getattr(param, GRAD_ALL_REDUCE_TAG))
    return True


def tag_for_grad_all_reduce(param: torch.Tensor, group: Optional[dist.ProcessGroup]) -> bool:
    """Tag ``param`` and register its :class:`GradAllReduce` hook over ``group``, once (a
    parameter already tagged keeps its hook). Returns whether a hook was registered."""
    if getattr(param, GRAD_ALL_REDUCE_TAG, None) is None:
        setattr(param, GRAD_ALL_REDUCE_TAG, GradAllReduce(group))
    return _register(param)


def install_grad_hooks(model: nn.Module) -> int:
    """Register the hook of every tagged parameter of ``model`` that lacks it (after a step that
    re-created parameters, e.g. materialising meta weights). Idempotent; returns how many hooks
    were registered."""
    return sum(_register(p) for p in model.parameters()
               if getattr(p, GRAD_ALL_REDUCE_TAG, None) is not None)
