"""The ``cpu`` profile: this machine, measured once and cached (``--calibrate`` re-measures;
``python -m end2end.simulate.calibrate [--out FILE]`` measures into FILE and prints it).

What the cache file (JSON) holds, every number measured here, nothing fitted to a config:

* ``eager``: the eager-PyTorch time model the simulator uses for ``--device cpu``
  (:mod:`end2end.simulate.cpu_model`, measured by :mod:`end2end.simulate.calibrate_eager`,
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
  (``slapo.testing.run_distributed``): the alpha-beta model of every collective;
  ``eager.collective_bandwidth``: the same per kind (all-reduce, all-gather into a 64 MB
  tensor, reduce-scatter of one), as the ring model reads it (``seconds = steps x alpha +
  factor x bytes / bandwidth``, :func:`end2end.simulate.timing.ring_factor`).
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
  engine on 2 gloo ranks (:mod:`end2end.simulate.calibrate_zero3`).
* ``format``: :data:`FORMAT` (a file of another format is refused with the command to
  re-measure it).
* ``threads`` (= ``cores``): ``torch.get_num_threads()`` of the measuring process (a 1-rank
  run's threads); ``measured``: when.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

import torch

from slapo.errors import ConfigError

__all__ = ["cpu_profile", "measure_cpu", "DEFAULT_CACHE", "FORMAT", "main"]

#: the calibration file's format; a file of another format is refused with the command to
#: re-measure it (what each format added: :data:`FORMAT_CHANGES`)
FORMAT = 3
FORMAT_CHANGES = {1: "the eager-PyTorch model",
                  2: "DeepSpeed ZeRO-3's seconds per hooked module, parameter and byte",
                  3: "the RSS's fixed part, from two reference runs"}

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
    """Latency (8-byte all-reduce) and bandwidth (64 MB) between two local gloo ranks with one
    thread each; the bandwidth of each kind (all-reduce, all-gather, reduce-scatter of 64 MB)."""
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

    from end2end.simulate.timing import ring_factor, ring_steps

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
    this process (which should simulate nothing else: :mod:`end2end.simulate.isolated`)."""
    from end2end.spec.layout import run_layout
    from end2end.simulate.microbatches import simulate_role
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

    from end2end.simulate.isolated import isolated

    points = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, ref in enumerate(MEMORY_REFERENCES):
            points.append((isolated("end2end.simulate.calibrate.simulated_peak", *ref),
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

    cpu = torch.device("cpu")
    flops = {name: max(measure_gemm_flops(cpu, getattr(torch, name), size=1024, seconds=0.3)
                       for _ in range(3)) for name in ("float32", "bfloat16")}
    flops["float16"] = flops["bfloat16"]
    from end2end.simulate.calibrate_eager import measure_eager

    from end2end.simulate.calibrate_zero3 import measure_zero3

    comm = _gloo_allreduce()
    runtime = measure_zero3(dict(alpha_s=comm["alpha_s"],
                                 collective_bandwidth=comm["collective_bandwidth"]))
    eager = dataclasses.replace(measure_eager(),
                                collective_bandwidth=comm.pop("collective_bandwidth"),
                                runtime_seconds=runtime)
    return dict(format=FORMAT, flops=flops, memory_bandwidth=_copy_bandwidth(), **comm,
                **memory_calibration(), eager=eager.to_json(), cores=eager.cores,
                threads=torch.get_num_threads(), measured=time.strftime("%Y-%m-%d %H:%M"))


def cpu_profile(cache: Optional[str] = None, recalibrate: bool = False):
    """The ``cpu`` :class:`~end2end.simulate.profiles.DeviceProfile` (cached measurement:
    ``cache``, default :data:`DEFAULT_CACHE`; measured when missing or ``recalibrate``)."""
    path = Path(cache) if cache else DEFAULT_CACHE
    if recalibrate or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(measure_cpu(), indent=1) + "\n")
    return profile_from_file(path)


def profile_from_file(path: Path):
    """The ``cpu`` profile of a calibration file written by :func:`cpu_profile`."""
    import psutil

    from end2end.simulate.cpu_model import EagerCpuModel
    from end2end.simulate.profiles import DeviceProfile

    hint = f"re-measure it: python -m end2end.simulate.calibrate --out {path}"
    try:
        data = json.loads(Path(path).read_text())
        eager = EagerCpuModel.from_json(data["eager"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        what = ("has no eager-PyTorch measurements (an older calibration)"
                if isinstance(exc, KeyError) else f"cannot be read ({type(exc).__name__}: {exc})")
        raise ConfigError(f"the cpu calibration {path} {what}",
                          call="end2end.simulate --device cpu", hint=hint) from None
    if data.get("format", 1) != FORMAT:
        raise ConfigError(f"the cpu calibration {path} has format {data.get('format', 1)}, this "
                          f"simulator reads format {FORMAT} (it measures more: "
                          f"{FORMAT_CHANGES[FORMAT]})", call="end2end.simulate --device cpu",
                          hint=hint)
    return dataclasses.replace(
        DeviceProfile("cpu", f"this machine, measured {data['measured']} ({path})",
                      float(psutil.virtual_memory().total), data["flops"],
                      data["memory_bandwidth"], data["bandwidth"], data["bandwidth"],
                      gpus_per_node=64),
        gemm_efficiency=1.0, memory_efficiency=0.8, kernel_overhead_s=2e-6,
        link_efficiency=1.0, alpha_s=data["alpha_s"], inter_alpha_s=data["alpha_s"],
        allocator_overhead=0.0, reserved_bytes=0.0,
        measured_overhead=data.get("memory_overhead", 0.0),
        measured_fixed_bytes=data.get("memory_fixed_bytes", 0.0), eager=eager)


def describe(profile) -> str:
    """A few lines that summarise a ``cpu`` profile (what the CLI prints)."""
    lines = [profile.description,
             "  GEMM 1024^3, all cores: " + ", ".join(
                 f"{d} {r / 1e9:.0f} GFLOP/s" for d, r in profile.flops.items()),
             f"  copy bandwidth {profile.memory_bandwidth / 1e9:.1f} GB/s; gloo all-reduce "
             f"alpha {profile.alpha_s * 1e6:.0f} us, {profile.intra_node_bandwidth / 1e9:.2f} "
             f"GB/s; RSS = {profile.measured_fixed_bytes / 1e9:.2f} GB + live bytes x "
             f"{1 + profile.measured_overhead:.2f}"]
    zero3 = profile.eager.runtime_seconds
    if zero3:
        lines.append("  ZeRO-3 per step (us) per module / parameter / MB: " + ", ".join(
            f"{phase} {zero3.get(f'zero3.module.{phase}', 0) * 1e6:.0f} / "
            f"{zero3.get(f'zero3.param.{phase}', 0) * 1e6:.0f} / "
            f"{zero3.get(f'zero3.byte.{phase}', 0) * 1e12:.0f}"
            for phase in ("forward", "backward", "optimizer")))
    for threads, m in sorted(profile.eager.per_threads.items()):
        mm = m.gemm["float32"]["mm"]
        lines.append(f"  {threads} thread(s): per op " + ", ".join(
            f"{k} {v * 1e6:.1f} us" for k, v in m.op_seconds.items()) + "; per view " +
            ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in m.view_seconds.items()))
        lines.append("    fp32 mm GFLOP/s: " + ", ".join(
            f"{f:.2g} FLOP {r / 1e9:.0f}" for f, r in mm.points))
        lines.append("    add GB/s: " + ", ".join(
            f"{b / 1e6:.2g} MB {r / 1e9:.0f}" for b, r in m.bandwidth.points))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m end2end.simulate.calibrate [--out FILE]``: measure this machine into FILE
    (default: the cache) and print the profile."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m end2end.simulate.calibrate",
                                description="Measure this machine for the simulator's cpu "
                                "profile (about 2.5 minutes; run it on a quiet machine).")
    p.add_argument("--out", default=str(DEFAULT_CACHE), help="the calibration file to write")
    p.add_argument("--memory-only", action="store_true",
                   help="re-measure only the memory relation (two reference runs; RSS does not "
                        "depend on the machine's load) in the existing FILE of --out, of this "
                        f"format or format {FORMAT - 1}, which then is of format {FORMAT}")
    args = p.parse_args(argv)
    if args.memory_only:
        return _remeasure_memory(Path(args.out))
    print(describe(cpu_profile(args.out, recalibrate=True)))
    return 0


def _remeasure_memory(path: Path) -> int:
    """``--memory-only``: the memory fields of ``path`` measured again (the rest kept)."""
    data = json.loads(path.read_text()) if path.exists() else {}
    if data.get("format") not in (FORMAT - 1, FORMAT):
        raise ConfigError(f"the cpu calibration {path} is missing or of format "
                          f"{data.get('format', 1)}", call="end2end.simulate.calibrate "
                          "--memory-only", hint=f"measure it whole: python -m "
                          f"end2end.simulate.calibrate --out {path}")
    data.update(memory_calibration(), format=FORMAT,
                memory_measured=time.strftime("%Y-%m-%d %H:%M"))
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(describe(profile_from_file(path)))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
