"""Keep freed activation memory for reuse when training on the CPU (glibc ``malloc``).

PyTorch's CPU tensors come straight from ``malloc``. glibc serves requests above its *mmap
threshold* (128 KiB at start, raised adaptively) with fresh ``mmap`` pages and returns them to
the kernel on ``free``; its heap is also trimmed whenever the free top exceeds the *trim
threshold*. A training step allocates and frees the same activation buffers (megabytes each)
every iteration, so every step pays a page fault and the kernel's zeroing of every 4 KiB page
of every activation again: measured on the benchmark's 4-layer GPT-Neo (seq 1024, 2 cores)
as 90k-290k minor faults and 0.3-0.9 s of system time per step. glibc does raise its thresholds
by itself after freeing mapped chunks, but whether a process ends up reusing or re-faulting
depends on its heap layout: the same 20-step script saw 10k or 160k faults from run to run.

:func:`keep_freed_memory` sets both thresholds so that buffers up to ``mmap_threshold`` are
carved from the heap and stay there after ``free``: the next step reuses them without a fault
(what the CUDA caching allocator does on a GPU). The cost is the same as there: the process's
resident memory stays at its peak instead of shrinking between steps. Benchmarks apply it to
every system they compare alike (``end2end/driver/bench.py``, ``scripts/bench_model_schedules.py``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from typing import Optional

__all__ = ["keep_freed_memory", "MAX_MMAP_THRESHOLD"]

_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
# glibc accepts at most HEAP_MAX_SIZE / 2 = 32 MiB on 64-bit systems (larger values are refused).
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024


def _libc() -> Optional[ctypes.CDLL]:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def keep_freed_memory(mmap_threshold: int = MAX_MMAP_THRESHOLD, trim: bool = False) -> bool:
    """Make glibc keep freed buffers up to ``mmap_threshold`` bytes for reuse (module docs).

    Args:
        mmap_threshold: requests at least this large still get their own ``mmap`` (and are
            returned on ``free``); at most :data:`MAX_MMAP_THRESHOLD`.
        trim: keep returning the free top of the heap to the kernel (``False``: never, so the
            buffers of the next step are already mapped).

    Returns ``True`` when applied, ``False`` where the C library is not glibc (macOS, musl,
    Windows: nothing is changed there).

    Raises:
        ValueError: ``mmap_threshold`` outside ``1 .. MAX_MMAP_THRESHOLD``.
    """
    if not 0 < mmap_threshold <= MAX_MMAP_THRESHOLD:
        raise ValueError(f"keep_freed_memory(mmap_threshold={mmap_threshold}): glibc accepts "
                         f"1 .. {MAX_MMAP_THRESHOLD} bytes (32 MiB); pass a value in range")
    libc = _libc()
    if libc is None:
        return False
    ok = libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(mmap_threshold))
    if not trim:
        ok &= libc.mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(2**31 - 1))
    return bool(ok)
