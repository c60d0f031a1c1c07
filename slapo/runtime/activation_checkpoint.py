"""RNG-exact activation checkpointing.

:func:`checkpoint` runs ``fn`` without keeping its activations and recomputes them in backward
(``torch.utils.checkpoint``, non-reentrant, so keyword arguments and non-tensor arguments work).
The default CPU/CUDA generators are restored for the recomputation by torch itself; in addition
the streams of slapo's RNG tracker (:mod:`slapo.runtime.rng`) are snapshotted at forward time and
restored for the recomputation, so dropout inside ``fork_rng`` regions draws the same masks twice
and the recomputed forward is bit-identical.

:func:`checkpoint_with_policy` is the selective form: the outputs of the ops a
:class:`~slapo.runtime.checkpoint_policy.SavePolicy` selects are kept, the rest recomputed (the
same RNG restoration; the policy never keeps a random op).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch.utils.checkpoint as torch_checkpoint

from .rng import get_rng_tracker

__all__ = ["checkpoint", "checkpoint_with_policy"]


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
    return checkpoint_with_policy(None, fn, *args, **kwargs)


def checkpoint_with_policy(policy: Optional[Any], fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """As :func:`checkpoint`, keeping the outputs of the ops ``policy`` (a
    :class:`~slapo.runtime.checkpoint_policy.SavePolicy`) selects; None keeps none."""
    call = functools.partial(fn, **kwargs) if kwargs else fn
    if get_rng_tracker().states:
        call = _TrackerRestoringFn(call)
    selective = {} if policy is None else {"context_fn": policy.context_fn}
    return torch_checkpoint.checkpoint(call, *args, use_reentrant=False, preserve_rng_state=True,
                                       **selective)
