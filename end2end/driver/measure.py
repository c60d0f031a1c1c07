"""What the benchmark driver measures, and how: timing, peak memory, parameter counts, faults.

* **Timing** (:class:`StepTimer`): every rank synchronises its device (``cuda.synchronize``) and
  then all ranks meet at a barrier before the clock starts and after the last measured step, so
  the measured window covers the slowest rank; the job's time is the maximum over ranks.
* **Peak memory per rank** (:class:`PeakMemory`): on CUDA ``torch.cuda.max_memory_allocated``
  after ``reset_peak_memory_stats`` at the start of the measured phase (warm-up + steps), so it
  includes the resident model state (parameters, gradients, optimizer state) plus the activation
  peak, like the artifact's "max allocated". On CPU there is no usable allocator statistic
  (torch keeps none for the CPU allocator), so it is the **resident-set high-water mark** of the
  same phase (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``) **minus a baseline**
  taken after the runtime's imports and before the model is built: again model state +
  activations + allocator slack of this rank, without the interpreter and libraries. Freed heap
  is returned to the OS (``malloc_trim``) before the phase starts so that a temporary full model
  (built before ZeRO-3 partitions it) does not count. Where ``clear_refs`` is not writable the
  lifetime peak (``ru_maxrss``) is used instead and ``method`` says so.
* **Parameters per rank** (:func:`local_parameters`): the elements this rank stores: its
  tensor-parallel shards, or its ZeRO-3 partition (``ds_tensor``) of DeepSpeed parameters.
* **Faults for tests** (:func:`maybe_inject_fault`): ``SLAPO_BENCH_FAULT=oom`` or ``crash``
  (optionally ``@RANK``) makes the first training step raise ``torch.OutOfMemoryError`` /
  ``RuntimeError`` on every rank (or only on ``RANK``); ``kill`` sends the rank SIGKILL (as the
  kernel's OOM killer would). Used only by tests/end2end/test_bench.py and test_sweep_errors.py.
* **Memory budget** (:func:`check_memory_budget`, the driver's ``--mem-budget-gb X``): a run
  whose peak memory per rank exceeds ``X`` GB raises :class:`MemoryBudgetExceeded` (a
  ``MemoryError``), so it becomes an ``oom`` row exactly like a CUDA out-of-memory error. On a
  CPU this is how an auto-tuner meets an OOM region at all: host memory rarely runs out at CPU
  scale, so **on CPU the OOM is a budget**, checked against the measured peak after warm-up and
  after the timed steps. On CUDA the real allocator limit is also lowered to the budget
  (:func:`limit_cuda_memory`, ``torch.cuda.set_per_process_memory_fraction``), so a real OOM
  happens where the budget would be crossed.
"""

from __future__ import annotations

import ctypes
import os
import resource
import time
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["rss_bytes", "PeakMemory", "StepTimer", "local_parameters", "is_oom",
           "maybe_inject_fault", "FAULT_ENV", "sync_device", "all_reduce_float",
           "MemoryBudgetExceeded", "check_memory_budget", "limit_cuda_memory"]

FAULT_ENV = "SLAPO_BENCH_FAULT"


def sync_device(device: torch.device) -> None:
    """Wait for queued device work (CUDA); a no-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def all_reduce_float(value: float, op: str = "max", device: Optional[torch.device] = None) -> float:
    """``value`` reduced over all ranks (``max``, ``min``, ``sum`` or ``avg``)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return float(value)
    ops = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "sum": dist.ReduceOp.SUM}
    if device is None:  # NCCL reduces CUDA tensors only
        device = (torch.device("cuda", torch.cuda.current_device())
                  if dist.get_backend() == "nccl" else torch.device("cpu"))
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=ops.get(op, dist.ReduceOp.SUM))
    return t.item() / (dist.get_world_size() if op == "avg" else 1)


def _status_kb(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_bytes() -> int:
    """Current resident set size of this process (``VmRSS``; ``ru_maxrss`` where unavailable)."""
    kb = _status_kb("VmRSS")
    if kb is not None:
        return kb * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _trim_heap() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS
        return _status_kb("VmHWM") is not None
    except OSError:
        return False


class PeakMemory:
    """Peak memory of one measured phase on this rank (see the module docstring).

    ``mark_baseline()`` after the imports, ``start()`` right before warm-up, ``peak_bytes()``
    after the last step. ``method`` names what was measured.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.baseline = 0
        self.method = "cuda_max_memory_allocated" if device.type == "cuda" else ""

    def mark_baseline(self) -> None:
        import gc

        gc.collect()
        _trim_heap()
        self.baseline = 0 if self.device.type == "cuda" else rss_bytes()

    def start(self) -> None:
        import gc

        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        _trim_heap()
        self.method = ("cpu_rss_hwm_over_baseline" if _reset_hwm()
                       else "cpu_ru_maxrss_over_baseline")

    def peak_bytes(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        kb = _status_kb("VmHWM") if self.method == "cpu_rss_hwm_over_baseline" else None
        peak = kb * 1024 if kb is not None else (
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        return max(0, peak - self.baseline)


class StepTimer:
    """Synchronised wall time of the measured steps (see the module docstring)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.step_times: List[float] = []
        self._t0 = self._last = 0.0

    def _barrier(self) -> None:
        sync_device(self.device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()

    def start(self) -> None:
        self._barrier()
        self._t0 = self._last = time.perf_counter()

    def lap(self) -> None:
        """After each step (local time of this rank; the loss read already synchronised)."""
        now = time.perf_counter()
        self.step_times.append(now - self._last)
        self._last = now

    def stop(self) -> float:
        """Seconds from ``start`` to the end of the slowest rank's last step."""
        self._barrier()
        return all_reduce_float(time.perf_counter() - self._t0, "max")


def local_parameters(model: Any) -> int:
    """Parameter elements stored on this rank (TP shards as they are; ZeRO-3 partitions; the
    local part of a DTensor: FSDP2 shards, DTensor TP)."""
    module = getattr(model, "module", model)
    if not isinstance(module, nn.Module):
        return 0
    total = 0
    for p in module.parameters():
        part = getattr(p, "ds_tensor", None)
        if part is None and hasattr(p, "to_local"):
            part = p.to_local()
        total += part.numel() if part is not None else p.numel()
    return total


class MemoryBudgetExceeded(MemoryError):
    """The run's peak memory per rank exceeded ``--mem-budget-gb`` (an ``oom`` row)."""


def check_memory_budget(peak_bytes: float, budget_gb: Optional[float], when: str) -> None:
    """Raise :class:`MemoryBudgetExceeded` if ``peak_bytes`` (max over ranks) is over budget."""
    if budget_gb is not None and peak_bytes > budget_gb * 1e9:
        raise MemoryBudgetExceeded(
            f"out of memory budget: peak {peak_bytes / 1e9:.3f} GB per rank {when} exceeds "
            f"--mem-budget-gb {budget_gb:g}")


def limit_cuda_memory(device: torch.device, budget_gb: Optional[float]) -> None:
    """On CUDA, cap this process's allocator at the budget so that a real OOM happens."""
    if budget_gb is None or device.type != "cuda":
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget_gb * 1e9 / total), device)


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` means out of memory (CUDA or host)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text


def maybe_inject_fault(rank: int, environ: Dict[str, str] = os.environ) -> None:
    """Raise the fault requested by ``SLAPO_BENCH_FAULT`` (tests only; see the module docs)."""
    spec = environ.get(FAULT_ENV, "").strip()
    if not spec:
        return
    kind, _, only = spec.partition("@")
    if only and int(only) != rank:
        return
    if kind == "oom":
        raise torch.OutOfMemoryError(f"injected out-of-memory on rank {rank} ({FAULT_ENV})")
    if kind == "crash":
        raise RuntimeError(f"injected crash on rank {rank} ({FAULT_ENV})")
    if kind == "kill":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    raise ValueError(f"{FAULT_ENV}={spec!r}: expected oom, crash or kill, optionally @RANK")
