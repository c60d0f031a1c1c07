"""What a rank needs of its GPU's memory beyond the peak of live tensors: the caching
allocator's configuration decides.

PyTorch's caching allocator (``c10/cuda/CUDACachingAllocator.cpp``) by default carves blocks out
of fixed segments it ``cudaMalloc``\\ s; a freed block can only be reused by a request that fits
in it, so near the card's capacity a run can fail with free memory split across segments. The
profiles charge that as ``allocator_overhead`` (10 %, assumed) on top of the peak. With
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (PyTorch's CUDA semantics notes,
"Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF") a segment grows by mapping more
physical pages into one virtual range, so freed memory is reusable at any size: the simulator
then takes no fragmentation overhead for the fits verdict (assumed: no published measurement of
the residue). torchtitan's launcher sets it (``run_llama_train.sh``, e.g. at commit 9628a18 of
pytorch/torchtitan), so the validation set judges its published runs so (``alloc_conf`` in
docs/results/validation/sources.tsv).

The predicted memory a run *reports* (``torch.cuda.max_memory_reserved``, as torchtitan logs it)
still includes what the allocator caches after frees: validation compares published memory with
the peak plus ``allocator_overhead`` whatever the configuration.

The configuration is read from ``PYTORCH_CUDA_ALLOC_CONF`` of the simulating process, the
variable a real run on that machine would read: set it as for the run being predicted.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

__all__ = ["ENV", "expandable_segments", "allocator_mode", "fragmentation", "needed_bytes",
           "configured"]

ENV = "PYTORCH_CUDA_ALLOC_CONF"


def expandable_segments(conf: Optional[str] = None) -> bool:
    """Whether the allocator configuration ``conf`` (default: the environment's
    ``PYTORCH_CUDA_ALLOC_CONF``, comma-separated ``key:value`` pairs) turns expandable segments
    on."""
    text = os.environ.get(ENV, "") if conf is None else conf
    for item in text.split(","):
        key, _, value = item.partition(":")
        if key.strip() == "expandable_segments":
            return value.strip() == "True"
    return False


def allocator_mode(conf: Optional[str] = None) -> str:
    """``expandable`` or ``default``: the allocator the predictions assume (a cache key)."""
    return "expandable" if expandable_segments(conf) else "default"


def fragmentation(profile, conf: Optional[str] = None) -> float:
    """The fraction of the peak the fits verdict adds for fragmentation: the profile's
    ``allocator_overhead``, none with expandable segments."""
    return 0.0 if expandable_segments(conf) else profile.allocator_overhead


def needed_bytes(peak: float, profile, conf: Optional[str] = None) -> float:
    """Bytes a rank needs for a peak of ``peak`` live bytes: the peak, its fragmentation
    (:func:`fragmentation`) and the profile's reserve (CUDA context, workspaces)."""
    return peak * (1 + fragmentation(profile, conf)) + profile.reserved_bytes


@contextlib.contextmanager
def configured(conf: str) -> Iterator[None]:
    """Within: ``PYTORCH_CUDA_ALLOC_CONF`` is ``conf`` (unset when empty), as for a run launched
    with it; the variable is restored after (simulator workers inherit it)."""
    before = os.environ.get(ENV)
    if conf:
        os.environ[ENV] = conf
    else:
        os.environ.pop(ENV, None)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before
