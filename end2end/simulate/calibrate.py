"""The ``cpu`` profile: this machine, measured once and cached (``--calibrate`` re-measures).

Measured: the GEMM rate per dtype (:func:`end2end.models.flops.measure_gemm_flops`, 1024^3, best
of three windows), the memory bandwidth (a large tensor copy) and the all-reduce latency and
bandwidth between two local gloo ranks (``slapo.testing.run_distributed``), and how far the
driver's CPU memory measurement (the RSS high-water mark over a baseline) exceeds the live bytes
the simulator counts, from one real run (:data:`MEMORY_REFERENCE`, :func:`memory_overhead`;
the profile's ``measured_overhead``). The efficiency factors are 1 (the measured rates are
already what kernels reach) except ``memory_efficiency``; nothing else is fitted.
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


# the one real run that calibrates how far the CPU's memory measurement (RSS) exceeds live tensors
MEMORY_REFERENCE = ("slapo", "cpu/bert", 1, 256, 8)


def measured_peak(mode: str, model: str, n: int, seq: int, batch: int, results: Path) -> float:
    """Peak memory per rank (bytes) of a real driver run (``python -m end2end.bench``, two
    steps after one warm-up, ``torchrun`` for ``n`` > 1): the row's ``PerGPUMem``."""
    import subprocess
    import sys

    from end2end.results.store import read_results

    launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={n}"] if n > 1 else [sys.executable])
    cmd = launch + ["-m", "end2end.bench", "--mode", mode, "--model", model, "--seq-len",
                    str(seq), "--dec-seq-len", "0", "--batch-size", str(batch), "--ckpt", "0",
                    "--steps", "2", "--warmup", "1", "--results", str(results), "--device",
                    "cpu", "--peak-tflops", "1"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    subprocess.run(cmd, capture_output=True, env=env, timeout=600, check=False)
    rows = [r for r in read_results(results).rows if r.impl == mode and r.ngpu == n]
    if not rows or rows[-1].status != "ok":
        raise RuntimeError(f"the reference run {' '.join(cmd)} wrote no ok row")
    return rows[-1].per_gpu_mem * 1e9


def simulated_peak(mode: str, model: str, n: int, seq: int, batch: int) -> float:
    """The simulator's peak of live bytes on rank 0 of the same run (this CPU's kernels), in
    this process (which should simulate nothing else: :mod:`end2end.simulate.isolated`)."""
    from end2end.driver.bench import run_layout
    from end2end.simulate.microbatches import simulate_role
    from end2end.spec.config_file import make_run_spec

    spec = make_run_spec(mode, model, n, seq, 0, batch, "0", steps=2, warmup=1, dtype="fp32")
    return float(simulate_role(spec, run_layout(spec), 0).memory["peak"])


def memory_overhead() -> float:
    """How far this machine's memory measurement exceeds the simulated live bytes, as a
    fraction: ``measured / simulated - 1`` on :data:`MEMORY_REFERENCE` (glibc's heap kept by
    ``slapo.keep_freed_memory``, fragmentation, the runtime's pages touched by the first step:
    what RSS sees and tensors do not)."""
    import tempfile

    from end2end.simulate.isolated import isolated

    with tempfile.TemporaryDirectory() as tmp:
        real = measured_peak(*MEMORY_REFERENCE, Path(tmp) / "reference.tsv")
    return real / isolated("end2end.simulate.calibrate.simulated_peak", *MEMORY_REFERENCE) - 1


def measure_cpu() -> Dict[str, float]:
    """Measure this machine (see the module docstring)."""
    from end2end.models.flops import measure_gemm_flops

    cpu = torch.device("cpu")
    flops = {name: max(measure_gemm_flops(cpu, getattr(torch, name), size=1024, seconds=0.3)
                       for _ in range(3)) for name in ("float32", "bfloat16")}
    flops["float16"] = flops["bfloat16"]
    comm = _gloo_allreduce()
    return dict(flops=flops, memory_bandwidth=_copy_bandwidth(), **comm,
                memory_overhead=memory_overhead(),
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
        allocator_overhead=0.0, reserved_bytes=0.0,
        measured_overhead=data.get("memory_overhead", 0.0))
