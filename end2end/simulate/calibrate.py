"""The ``cpu`` profile: this machine, measured once and cached (``--calibrate`` re-measures).

Measured: the GEMM rate per dtype (:func:`end2end.models.flops.measure_gemm_flops`, 1024^3, best
of three windows), the memory bandwidth (a large tensor copy) and the all-reduce latency and
bandwidth between two local gloo ranks (``slapo.testing.run_distributed``). The efficiency
factors are 1 (the measured rates are already what kernels reach) except
``memory_efficiency``; nothing else is fitted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Dict, Optional

import torch

__all__ = ["cpu_profile", "measure_cpu", "DEFAULT_CACHE"]

DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / \
    "slapo" / "cpu_profile.json"


def _copy_bandwidth(seconds: float = 0.3) -> float:
    src = torch.empty(32 * 2**20, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        began = time.perf_counter()
        dst.copy_(src)
        best = max(best, 2 * src.numel() * 4 / (time.perf_counter() - began))
    return best


def _gloo_allreduce() -> Dict[str, float]:
    """Latency (8-byte all-reduce) and bandwidth (64 MB) between two local gloo ranks."""
    from slapo.testing import run_distributed

    results = run_distributed(_allreduce_worker, world_size=2)
    return results[0] if isinstance(results, list) else results


def _allreduce_worker() -> Dict[str, float]:
    import torch.distributed as dist

    def timed(t: torch.Tensor, reps: int) -> float:
        dist.barrier()
        began = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(t)
        return (time.perf_counter() - began) / reps

    small, big = torch.zeros(2), torch.zeros(16 * 2**20)
    timed(small, 3)
    latency = timed(small, 50)
    per_call = timed(big, 3)
    # ring all-reduce moves 2 (n-1)/n of the tensor: n = 2 -> the tensor's size
    return dict(alpha_s=latency, bandwidth=big.numel() * 4 / max(per_call - latency, 1e-9))


def measure_cpu() -> Dict[str, float]:
    """Measure this machine (see the module docstring)."""
    from end2end.models.flops import measure_gemm_flops

    cpu = torch.device("cpu")
    flops = {name: max(measure_gemm_flops(cpu, getattr(torch, name), size=1024, seconds=0.3)
                       for _ in range(3)) for name in ("float32", "bfloat16")}
    flops["float16"] = flops["bfloat16"]
    comm = _gloo_allreduce()
    return dict(flops=flops, memory_bandwidth=_copy_bandwidth(), **comm,
                threads=torch.get_num_threads(), measured=time.strftime("%Y-%m-%d %H:%M"))


def cpu_profile(cache: Optional[str] = None, recalibrate: bool = False):
    """The ``cpu`` :class:`~end2end.simulate.profiles.DeviceProfile` (cached measurement)."""
    from end2end.simulate.profiles import DeviceProfile

    path = Path(cache) if cache else DEFAULT_CACHE
    if recalibrate or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(measure_cpu(), indent=1))
    data = json.loads(path.read_text())
    import psutil

    return dataclasses.replace(
        DeviceProfile("cpu", f"this machine, measured {data['measured']} ({path})",
                      float(psutil.virtual_memory().total), data["flops"],
                      data["memory_bandwidth"], data["bandwidth"], data["bandwidth"],
                      gpus_per_node=64),
        gemm_efficiency=1.0, memory_efficiency=0.8, kernel_overhead_s=2e-6,
        link_efficiency=1.0, alpha_s=data["alpha_s"], inter_alpha_s=data["alpha_s"],
        allocator_overhead=0.0, reserved_bytes=0.0)
