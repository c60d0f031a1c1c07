"""Activation checkpointing where a module is not simply "one layer, called once": shared by
the recipes (counted once, like ``common.py``).

* :func:`checkpoint_shared_layers`: a layer group called several times per forward (ALBERT's one
  shared layer): exactly the calls ``checkpoint_layer_ids(L, ratio)`` are recomputed
  (:class:`CheckpointCalls`, the count restarted per forward by :class:`ResetCalls`), with the
  selective ``ckpt_policy`` when one is given.
* :class:`BufferSafeCheckpoint`: RNG-exact checkpointing of a block with buffers (BatchNorm
  running statistics), restored after the recomputation so they are updated once per forward.
"""

from __future__ import annotations

from typing import Any, FrozenSet, List

import torch
from torch import nn

from ..runtime.activation_checkpoint import checkpoint as rng_exact_checkpoint
from ..runtime.forward_wrap import install_forward_wrapper
from ..primitives.checkpoint import CheckpointForward
from ..runtime.checkpoint_policy import resolve_policy
from ..schedule import Schedule
from . import common as C
from .config import checkpoint_layer_ids

__all__ = ["CheckpointCalls", "ResetCalls", "checkpoint_shared_layers", "BufferSafeCheckpoint"]


class CheckpointCalls:
    """Forward wrapper: checkpoint only the ``calls``-th calls (0-based) of a module that one
    model forward calls several times; :class:`ResetCalls` restarts the count per forward."""

    def __init__(self, calls: FrozenSet[int], path: str, policy: Any = ""):
        self.calls, self.count = frozenset(calls), 0
        self.checkpoint = CheckpointForward(path, resolve_policy(policy) if policy else None)

    def __call__(self, inner: Any, *args: Any, **kwargs: Any) -> Any:
        index, self.count = self.count, self.count + 1
        if index in self.calls and torch.is_grad_enabled():
            return self.checkpoint(inner, *args, **kwargs)
        return inner(*args, **kwargs)


class ResetCalls:
    """Forward pre-hook of the module that makes the calls: restart every counter."""

    def __init__(self, wrappers: List[CheckpointCalls]):
        self.wrappers = wrappers

    def __call__(self, module: Any, args: Any) -> None:
        for w in self.wrappers:
            w.count = 0


def checkpoint_shared_layers(sch: Schedule, encoder: str, num_layers: int, ratio: float,
                             policy: Any = "") -> None:
    """Checkpoint the calls ``checkpoint_layer_ids(num_layers, ratio)`` of the layer groups (HF
    calls group ``int(i / (L / G))`` for layer ``i``), selectively with ``policy`` if given."""
    groups = C.layer_paths(sch, C.join(encoder, "albert_layer_groups"))
    ids = checkpoint_layer_ids(num_layers, ratio)
    per_group = num_layers // len(groups)
    wrappers = []
    for g, path in enumerate(groups):
        calls = frozenset(i - g * per_group for i in ids if i // per_group == g)
        if len(calls) == per_group:
            sch[path].checkpoint(**({"policy": policy} if policy else {}))
        elif calls:
            wrappers.append(CheckpointCalls(calls, path, policy))
            install_forward_wrapper(sch[path].mod, "checkpoint", wrappers[-1])
            sch[path].metadata["checkpoint"] = sorted(calls)
    if wrappers:
        sch[encoder].mod.register_forward_pre_hook(ResetCalls(wrappers))


class _RestoreBuffersOnRecompute:
    """Calls ``fn``; every later call (the recomputation) leaves ``module``'s buffers as they
    were, so BatchNorm running statistics are updated once per forward, as without
    checkpointing."""

    def __init__(self, fn: Any, module: nn.Module):
        self.fn, self.module, self.calls = fn, module, 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            return self.fn(*args)
        saved = [(b, b.detach().clone()) for b in self.module.buffers()]
        try:
            return self.fn(*args)
        finally:
            with torch.no_grad():
                for b, value in saved:
                    b.copy_(value)


class BufferSafeCheckpoint:
    """Forward wrapper: RNG-exact activation checkpointing that keeps buffers exact."""

    def __init__(self, module: nn.Module):
        self.module = module

    def __call__(self, inner: Any, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return inner(x)
        return rng_exact_checkpoint(_RestoreBuffersOnRecompute(inner, self.module), x)
