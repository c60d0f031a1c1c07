"""The ``cpu`` profile: this machine, measured once and cached (``--calibrate`` re-measures;
``python -m end2end.simulate.calibrate [--out FILE]`` measures into FILE and prints it). The
file is read by :mod:`end2end.simulate.cost.profiles`; :func:`device_profile` is the profile
a command asks for, measuring the ``cpu`` one when needed.

What the cache file (JSON) holds, every number measured here, nothing fitted to a config:

* ``eager``: the eager-PyTorch time model the simulator uses for ``--device cpu``
  (:mod:`end2end.simulate.cost.cpu_model`, measured by :mod:`end2end.simulate.calibration.eager`,
  whose docstring says what each of its numbers is): per thread count (1, and ``cores``), GEMM
  FLOP/s over FLOPs per call per kind and dtype, elementwise bandwidth over bytes per op and a
  slowdown per op name, and the seconds per recorded op (and per view) in the forward, backward
  and optimizer step.
* ``flops``: FLOP/s of a 1024^3 GEMM with every core per dtype (best of three windows,
  :func:`end2end.models.flops.measure_gemm_flops`; float16 = bfloat16): the peak the rows' MFU
  and ``PeakTFLOPS`` refer to.
* ``memory_bandwidth``: bytes/s of a 128 MB tensor copy with every core (read + write).
* ``alpha_s``, ``bandwidth``: the latency of an 8-byte all-reduce and the bandwidth (bytes/s
  of the tensor, 64 MB) between two local gloo ranks with one thread each
  (:func:`~end2end.simulate.calibration.local_ranks.on_local_ranks`): the alpha-beta model of every
  collective;
  ``eager.collective_bandwidth``: the same per kind (all-reduce, all-gather into a 64 MB
  tensor, reduce-scatter of one), as the ring model reads it (``seconds = steps x alpha +
  factor x bytes / bandwidth``, :func:`end2end.simulate.cost.timing.ring_factor`).
* ``memory_overhead``, ``memory_fixed_bytes``: how the driver's CPU memory measurement (the
  RSS high-water mark over a baseline) relates to the peak of live bytes the simulator counts,
  ``measured = fixed + (1 + overhead) x simulated``, from two real runs of one model at two
  batch sizes (:data:`MEMORY_REFERENCES`, :func:`memory_calibration`; the profile's
  ``measured_fixed_bytes`` and ``measured_overhead``): the fixed part is what a process touches
  whatever the batch (the libraries' pages and buffers of the first step, thread stacks), the
  proportional part glibc's heap that keeps freed buffers (``slapo.keep_freed_memory``:
  fragmentation grows with what the step allocates).
* ``eager.runtime_seconds``: what DeepSpeed ZeRO-3 adds per step beyond the recorded ops,
  seconds per hooked module, parameter and parameter byte per phase, measured with a real
  engine on 2 gloo ranks (:mod:`end2end.simulate.calibration.zero3`).
* ``format``: :data:`~end2end.simulate.cost.profiles.FORMAT` (a file of another format is
  refused with the command to re-measure it).
* ``threads`` (= ``cores``): ``torch.get_num_threads()`` of the measuring process (a 1-rank
  run's threads); ``measured``: when.
* ``load``: the machine's load when the measurement began (load average, cores, the busy and
  stolen shares of CPU time over half a second) and the spread of the three GEMM windows
  (:mod:`end2end.simulate.calibration.load`); rows predicted with the file say it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Dict, Optional

import torch

from slapo.errors import ConfigError

from end2end.simulate.cost.profiles import DEFAULT_CACHE, FORMAT, profile_from_file

__all__ = ["cpu_profile", "device_profile", "measure_cpu", "memory_calibration",
           "affine_memory", "measured_peak", "simulated_peak", "MEMORY_REFERENCES"]

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
    """Latency (8-byte all-reduce) and bandwidth (64 MB) between two local gloo ranks with one
    thread each; the bandwidth of each kind (all-reduce, all-gather, reduce-scatter of 64 MB)."""
    from end2end.simulate.calibration.local_ranks import on_local_ranks

    return on_local_ranks(_allreduce_worker, 2, timeout=240)[0]


def _allreduce_worker() -> Dict[str, float]:
    import torch.distributed as dist

    def timed(t: torch.Tensor, reps: int) -> float:
        dist.barrier()
        began = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(t)
        return (time.perf_counter() - began) / reps

    from end2end.simulate.cost.timing import ring_factor, ring_steps

    torch.set_num_threads(1)  # as each rank of a multi-rank run (torchrun: OMP_NUM_THREADS=1)
    small, big = torch.zeros(2), torch.zeros(16 * 2**20)
    half = torch.empty(big.numel() // 2)
    timed(small, 3)
    latency = timed(small, 50)
    calls = dict(allreduce=lambda: dist.all_reduce(big),
                 allgather=lambda: dist.all_gather_into_tensor(big, half),
                 reducescatter=lambda: dist.reduce_scatter_tensor(half, big))
    bandwidth = {}
    for kind, call in calls.items():
        call()
        began = time.perf_counter()
        for _ in range(3):
            call()
        seconds = (time.perf_counter() - began) / 3 - ring_steps(kind, 2) * latency
        # what the ring model reads: seconds = factor x bytes (of the whole tensor) / bandwidth
        bandwidth[kind] = ring_factor(kind, 2) * big.numel() * 4 / max(seconds, 1e-9)
    return dict(alpha_s=latency, bandwidth=bandwidth["allreduce"],
                collective_bandwidth=bandwidth)


# the two real runs (one model, two batch sizes) that calibrate how the CPU's memory measurement
# (RSS) relates to live tensors
MEMORY_REFERENCES = (("slapo", "cpu/bert", 1, 256, 8), ("slapo", "cpu/bert", 1, 256, 2))


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
    this process (which should simulate nothing else: :mod:`end2end.simulate.engine.isolated`)."""
    from end2end.spec.layout import run_layout
    from end2end.simulate.engine.microbatches import simulate_role
    from end2end.spec.config_file import make_run_spec

    spec = make_run_spec(mode, model, n, seq, 0, batch, "0", steps=2, warmup=1, dtype="fp32")
    return float(simulate_role(spec, run_layout(spec), 0).memory["peak"])


def memory_calibration() -> Dict[str, float]:
    """How this machine's memory measurement relates to the simulated live bytes:
    ``measured = memory_fixed_bytes + (1 + memory_overhead) x simulated``, the line through
    the two runs of :data:`MEMORY_REFERENCES` (measured for real, and simulated, each in a
    process of its own). A slope below 1 or a negative intercept (noise) falls back to the
    proportional model through the larger run (``memory_fixed_bytes`` 0)."""
    import tempfile

    from end2end.simulate.engine.isolated import isolated

    points = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, ref in enumerate(MEMORY_REFERENCES):
            points.append((isolated("end2end.simulate.calibration.cpu.simulated_peak", *ref),
                           measured_peak(*ref, Path(tmp) / f"reference{i}.tsv")))
    return affine_memory(points)


def affine_memory(points) -> Dict[str, float]:
    """``memory_overhead`` and ``memory_fixed_bytes`` of the line through two
    ``(simulated, measured)`` points (see :func:`memory_calibration`)."""
    (s1, m1), (s2, m2) = sorted(points, reverse=True)
    slope = (m1 - m2) / (s1 - s2) if s1 > s2 else 0.0
    fixed = m1 - slope * s1
    if slope < 1.0 or fixed < 0:
        return dict(memory_overhead=m1 / s1 - 1, memory_fixed_bytes=0.0)
    return dict(memory_overhead=slope - 1, memory_fixed_bytes=fixed)


def measure_cpu() -> Dict[str, float]:
    """Measure this machine (see the module docstring)."""
    from end2end.models.flops import measure_gemm_flops

    from end2end.simulate.calibration.load import machine_load, spread

    load = machine_load()
    cpu = torch.device("cpu")
    repeats = {name: [measure_gemm_flops(cpu, getattr(torch, name), size=1024, seconds=0.3)
                      for _ in range(3)] for name in ("float32", "bfloat16")}
    flops = {name: max(values) for name, values in repeats.items()}
    flops["float16"] = flops["bfloat16"]
    load["spread"] = round(max(spread(v) for v in repeats.values()), 3)
    from end2end.simulate.calibration.eager import measure_eager

    from end2end.simulate.calibration.zero3 import measure_zero3

    comm = _gloo_allreduce()
    runtime = measure_zero3(dict(alpha_s=comm["alpha_s"],
                                 collective_bandwidth=comm["collective_bandwidth"]))
    eager = dataclasses.replace(measure_eager(),
                                collective_bandwidth=comm.pop("collective_bandwidth"),
                                runtime_seconds=runtime)
    return dict(format=FORMAT, flops=flops, memory_bandwidth=_copy_bandwidth(), **comm,
                **memory_calibration(), eager=eager.to_json(), cores=eager.cores,
                threads=torch.get_num_threads(), measured=time.strftime("%Y-%m-%d %H:%M"),
                load=load)


def cpu_profile(cache: Optional[str] = None, recalibrate: bool = False):
    """The ``cpu`` :class:`~end2end.simulate.cost.profiles.DeviceProfile` (cached measurement:
    ``cache``, default :data:`DEFAULT_CACHE`; measured when missing or ``recalibrate``).

    Measuring checks the machine first (:mod:`end2end.simulate.calibration.load`): a calibration
    nobody asked for (the file missing, no ``recalibrate``) is refused on a busy machine with a
    one-line error; one asked for is measured with a one-line warning, and the file records
    the load either way (the GEMM repeats' spread too, warned about when large)."""
    from end2end.simulate.calibration.load import describe_load, machine_load, verdict

    path = Path(cache) if cache else DEFAULT_CACHE
    if recalibrate or not path.exists():
        busy = verdict(machine_load())
        if busy and not recalibrate:
            raise ConfigError(f"no cpu calibration at {path}, and this machine is busy "
                              f"({busy}): it is not measured implicitly",
                              call="end2end.simulate --device cpu",
                              hint=f"measure it on a quiet machine (python -m "
                                   f"end2end.simulate.calibrate --out {path}) or pass "
                                   "--calibration docs/results/cpu_profile.json")
        if busy:
            _warn(f"calibrating on a busy machine ({busy}): the cpu profile will be wrong; "
                  "re-measure on a quiet one")
        path.parent.mkdir(parents=True, exist_ok=True)
        data = measure_cpu()
        path.write_text(json.dumps(data, indent=1) + "\n")
        after = verdict(data.get("load") or {})
        if after and not busy:
            _warn(f"the calibration in {path} was measured under load "
                  f"({describe_load(data.get('load'))})")
    return profile_from_file(path)


def _warn(line: str) -> None:
    """One line on stderr, through the commands' logger."""
    from end2end.cli import get_logger

    get_logger("end2end.simulate.calibrate").warning(line)


def device_profile(name: str, calibration: Optional[str] = None, recalibrate: bool = False):
    """The profile called ``name`` for a command: ``cpu`` measured on this machine when
    ``recalibrate`` or, on a quiet machine only, when its calibration file (``calibration``,
    default the cache) is missing (:func:`cpu_profile`), then read; the GPU profiles from their
    table (:func:`end2end.simulate.cost.profiles.get_profile`)."""
    from end2end.simulate.cost.profiles import get_profile

    if name == "cpu":
        return cpu_profile(calibration, recalibrate)
    return get_profile(name)
