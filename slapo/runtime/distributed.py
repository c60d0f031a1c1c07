"""Process groups, device choice and teardown for every runtime: the one place that sets them up.

All build targets (``torch``, ``deepspeed``, ``megatron``) and the benchmark driver call
:func:`init_distributed` instead of ``torch.distributed.init_process_group`` themselves, so device
selection, backend choice and timeouts are decided once:

* device: ``cuda:<LOCAL_RANK>`` when CUDA is available, else the CPU;
* backend: ``nccl`` on CUDA, ``gloo`` on CPU (override with ``backend=``);
* launch: under ``torchrun`` (``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` set) the env:// rendezvous;
  without them a single-process group (world size 1) on an in-memory store, so a plain
  ``python train.py`` runs the same code;
* an already initialised default group (e.g. from a test harness) is reused as it is.

**Bounded failures.** Every group this module (or a dialect through it) creates gets a timeout
(``SLAPO_DIST_TIMEOUT`` seconds, default 600): when one rank dies, the others fail in their next
collective after at most that long instead of hanging forever. (On NCCL this relies on PyTorch's
asynchronous error handling, on by default since torch 2.2.) Launchers should still kill the
remaining ranks when one exits with an error (``torchrun`` does; so does
``slapo.testing.run_distributed``).

:func:`teardown` (``slapo.teardown``) undoes everything: runtime-specific state registered with
:func:`register_teardown` (megatron's parallel state, DeepSpeed's communication backend, cached
groups) first, then a drain of the collective threads, then the default group if this module
created it. An ``atexit`` hook (:mod:`slapo.runtime.lifecycle`) drains the threads at exit even
when ``teardown`` is never called.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

from ..errors import BuildError
from .lifecycle import drain_collective_threads, install_exit_hook, note_distributed_use

__all__ = [
    "DistEnv",
    "pick_device",
    "backend_for",
    "default_timeout",
    "init_distributed",
    "register_teardown",
    "teardown",
]

_OWNS_DEFAULT_GROUP = False
_TEARDOWNS: List[Callable[[], None]] = []


@dataclasses.dataclass(frozen=True)
class DistEnv:
    """Where this process runs: its global rank, world size, local rank, device and backend."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def default_timeout() -> datetime.timedelta:
    """The collective timeout for groups created by Slapo (``SLAPO_DIST_TIMEOUT`` seconds)."""
    return datetime.timedelta(seconds=float(os.environ.get("SLAPO_DIST_TIMEOUT", "600")))


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def pick_device(local_rank: Optional[int] = None) -> torch.device:
    """``cuda:<local_rank>`` when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        index = _local_rank() if local_rank is None else local_rank
        return torch.device("cuda", index % torch.cuda.device_count())
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    """The collective backend for ``device``: ``nccl`` on CUDA, ``gloo`` otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def _env() -> DistEnv:
    device = pick_device()
    return DistEnv(rank=dist.get_rank(), world_size=dist.get_world_size(),
                   local_rank=_local_rank(), device=device, backend=dist.get_backend())


def init_distributed(
    backend: Optional[str] = None, timeout: Optional[datetime.timedelta] = None
) -> DistEnv:
    """Initialise ``torch.distributed`` if needed and return this process's :class:`DistEnv`.

    Reuses an existing default group. Otherwise joins the ``torchrun`` rendezvous when its
    variables are set, or creates a world of one. On CUDA the current device is set to
    ``cuda:<LOCAL_RANK>``.

    Raises:
        BuildError: ``torch.distributed`` is not available in this PyTorch build.
    """
    global _OWNS_DEFAULT_GROUP
    install_exit_hook()
    note_distributed_use()
    if not dist.is_available():
        raise BuildError("torch.distributed is not available in this PyTorch build",
                         call="init_distributed", hint="install a PyTorch wheel with "
                         "distributed support (the official wheels have it)")
    device = pick_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = backend or backend_for(device)
        timeout = timeout or default_timeout()
        if "MASTER_ADDR" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend, init_method="env://", timeout=timeout)
        else:  # a plain single-process run
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timeout)
        _OWNS_DEFAULT_GROUP = True
    return _env()


def register_teardown(fn: Callable[[], None]) -> None:
    """Run ``fn`` at the next :func:`teardown` (before the default group is destroyed); a
    function registered twice runs once."""
    if fn not in _TEARDOWNS:
        _TEARDOWNS.append(fn)


def teardown() -> None:
    """End Slapo's use of ``torch.distributed`` in this process (public as ``slapo.teardown``).

    Releases the runtime state registered with :func:`register_teardown`, most recent first
    (megatron's parallel state, DeepSpeed's communication back-end, Slapo's cached pipeline and
    data-parallel groups); waits, with the GIL released, until the collective back-end's worker
    threads have finished with their last collectives (:mod:`slapo.runtime.lifecycle` explains
    the exit abort this prevents); then destroys the default process group if
    :func:`init_distributed` created it. Safe to call more than once, and before or after the
    user's own ``dist.destroy_process_group()``; not needed for a clean exit (an ``atexit`` hook
    drains the threads too), but it ends the run at a point of the script's choosing."""
    global _OWNS_DEFAULT_GROUP
    while _TEARDOWNS:
        _TEARDOWNS.pop()()
    drain_collective_threads()
    if _OWNS_DEFAULT_GROUP and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _OWNS_DEFAULT_GROUP = False
