"""A clean interpreter exit after collectives: why a finished run could abort, and the guard.

**The cause** (found with a core dump of an aborted rank: ``terminate called without an active
exception``, SIGABRT, ``<no Python frame>``). A gloo process group runs each collective on a
worker thread of its own. When the collective's ``Work`` completes, the calling thread's
``wait()`` returns and drops its reference; the worker drops the last one a moment later, *on the
worker thread*, and with it the C++ references to the collective's tensors. Releasing a tensor
that still has a Python object needs the GIL (``TensorImpl::decref_pyobject``). If the script
returns in that moment - the last collective of the step, ``destroy_process_group()``, the end of
the script: a few milliseconds, more on a loaded machine - the interpreter has begun to finalize
by the time the worker asks for the GIL; Python then ends the thread with ``pthread_exit``, whose
forced unwind runs through the ``noexcept`` destructor of the ``Work`` and calls
``std::terminate``. So the abort is a race between gloo's worker threads and interpreter
finalization, not a leak: any gloo collective can lose it (DeepSpeed's and megatron's included),
and a schedule makes it likely because its forward and backward end in collectives.
``destroy_process_group()`` does not help (gloo's ``shutdown`` does nothing, and the group's
threads live on while anything references the group); a delay before exit does (the reported
``gc.collect()`` variant never aborted).

**The guard.** :func:`drain_collective_threads` releases the GIL until no foreign (C++) thread
holds or waits for it and no other thread of the process is runnable (a worker that finished its
collective but has not been scheduled since is runnable), for at least a short grace period and
at most two seconds, so every worker finishes its release while the interpreter is intact. It
runs in :func:`slapo.teardown` and in an ``atexit`` hook (atexit functions run before Python sets
its finalizing flag), installed by :func:`install_exit_hook` when Slapo is imported; it drains
whenever ``torch.distributed`` is loaded (also for collectives Slapo never saw: DDP's, a user's,
after the user destroyed the group). Scripts need no ``os._exit`` and no particular order of
calls.

This module imports nothing from Slapo.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
import time

__all__ = ["drain_collective_threads", "install_exit_hook", "note_distributed_use",
           "foreign_thread_states", "runnable_threads", "GRACE_S", "MAX_WAIT_S"]

GRACE_S = 0.02     # always wait this long
MAX_WAIT_S = 2.0   # never wait longer (a foreign thread that keeps a thread state forever)
_POLL_S = 0.002

_USED = False
_INSTALLED = False


def note_distributed_use() -> None:
    """Record that this process set up a process group (``init_distributed`` calls it), so the
    exit hook drains even where ``torch.distributed`` is no longer in ``sys.modules``."""
    global _USED
    _USED = True


def _thread_state_count() -> int:
    api = ctypes.pythonapi
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
    api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
    api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
    api.PyThreadState_Next.restype = ctypes.c_void_p
    count, ts = 0, api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
    while ts:
        count += 1
        ts = api.PyThreadState_Next(ts)
    return count


def foreign_thread_states() -> int:
    """Thread states that belong to no ``threading`` thread: C++ threads (gloo workers) that
    hold or wait for the GIL right now."""
    return max(0, _thread_state_count() - threading.active_count())


def runnable_threads() -> int:
    """Other threads of this process that are running or waiting for a CPU (state ``R`` in
    ``/proc/self/task``; 0 where there is no ``/proc``). A gloo worker that finished its
    collective but was not yet scheduled to release it is one."""
    me = str(threading.get_native_id())
    try:
        tids = [t for t in os.listdir("/proc/self/task") if t != me]
    except OSError:
        return 0
    busy = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        busy += stat[stat.rfind(")") + 2:].startswith("R")
    return busy


def drain_collective_threads(grace_s: float = GRACE_S, max_wait_s: float = MAX_WAIT_S) -> float:
    """Release the GIL until no foreign thread holds or waits for it and no other thread is
    runnable (at least ``grace_s``, at most ``max_wait_s`` seconds); return the seconds waited.
    Safe to call any time; see the module docstring for why."""
    start = time.monotonic()
    while True:
        time.sleep(_POLL_S)  # releases the GIL: a waiting worker takes it and finishes
        waited = time.monotonic() - start
        if waited >= max_wait_s:
            return waited
        if waited >= grace_s and foreign_thread_states() == 0 and runnable_threads() == 0:
            return waited


def _distributed_in_use() -> bool:
    """Whether collective threads may exist: a group was used or is initialised, or
    ``torch.distributed`` is loaded at all (a script may have run its own collectives and
    destroyed the group before exit; the drain then costs only its grace period)."""
    if _USED:
        return True
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available())


def _at_exit() -> None:
    if _distributed_in_use():
        drain_collective_threads()


def install_exit_hook() -> None:
    """Register the exit drain once per process (idempotent)."""
    global _INSTALLED
    if not _INSTALLED:
        atexit.register(_at_exit)
        _INSTALLED = True
