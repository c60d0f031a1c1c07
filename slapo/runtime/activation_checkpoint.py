"""RNG-exact activation checkpointing.

:func:`checkpoint` runs ``fn`` without keeping its activations and recomputes them in backward
(``torch.utils.checkpoint``, non-reentrant, so keyword arguments and non-tensor arguments work).
The default CPU/CUDA generators are restored for the recomputation by torch itself; in addition
the streams of slapo's RNG tracker (:mod:`slapo.runtime.rng`) are snapshotted at forward time and
restored for the recomputation, so dropout inside ``fork_rng`` regions draws the same masks twice
and the recomputed forward is bit-identical.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch.utils.checkpoint as torch_checkpoint

from .rng import get_rng_tracker

__all__ = ["checkpoint"]


class _TrackerRestoringFn:
    """Calls ``fn``; on every call after the first, runs it on the forward-time tracker states."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.tracker = get_rng_tracker()
        self.snapshot = self.tracker.get_states()
        self.calls = 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            return self.fn(*args)
        current = self.tracker.get_states()
        self.tracker.set_states(self.snapshot)
        try:
            return self.fn(*args)
        finally:
            self.tracker.set_states(current)


def checkpoint(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with its activations recomputed in backward (RNG-exact)."""
    call = functools.partial(fn, **kwargs) if kwargs else fn
    if get_rng_tracker().states:
        call = _TrackerRestoringFn(call)
    return torch_checkpoint.checkpoint(call, *args, use_reentrant=False, preserve_rng_state=True)
