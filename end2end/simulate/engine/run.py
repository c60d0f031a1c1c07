"""One run simulated: its layout checked as the driver checks it, every distinct role stepped on
fake tensors, the time model applied, and the row it gets.

A run's roles: tensor-parallel ranks of a stage do the same work and data-parallel replicas the
same, so one rank per pipeline stage is simulated (global rank ``s x TP x DP`` of stage ``s``:
the world is laid out TP x DP x PP, :class:`end2end.spec.layout.Layout`). Each run is simulated in a
process of its own (``python -m end2end.simulate.engine.worker``): runtimes keep global state
(megatron-core's parallel state), and a fresh process returns its memory.

Outcomes: ``sim`` (predicted to fit), ``sim-oom`` (predicted peak per rank, plus the profile's
allocator overhead, above the device's memory), ``fail`` with the error a real run raises (an
invalid layout, an indivisible head count, a mode refusing ``--pp``: the same exception, since
the same code runs).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

__all__ = ["simulate_run", "simulate_runs", "simulate_in_process", "in_order"]

T = TypeVar("T")


def simulate_in_process(spec, profile) -> Dict[str, Any]:
    """Simulate ``spec`` in this process: the row's fields (``status``, metrics, ``error``,
    ``extra``). A failure is a ``fail`` row (or ``oom``: an OOM raised while building)."""
    from end2end.driver.measure import is_oom
    from end2end.spec.layout import run_layout
    from end2end.simulate.engine.microbatches import simulate_role

    began = time.perf_counter()
    try:
        layout = run_layout(spec)
        gpu = profile.compute_capability if profile.eager is None else False
        ranks = layout.stage_leaders()
        results = [simulate_role(spec, layout, r, gpu, isolate=len(ranks) > 1) for r in ranks]
    except Exception as exc:  # noqa: BLE001  (every failure becomes a row, as in the driver)
        return dict(status="oom" if is_oom(exc) else "fail",
                    error=f"rank 0: {type(exc).__name__}: {exc}",
                    extra=dict(traceback=traceback.format_exc(), simulated=True))
    values = _values(spec, layout, results, profile)
    values["extra"]["simulate_seconds"] = round(time.perf_counter() - began, 2)
    return values


#: what a ``sim-oom`` row's error adds by allocator mode (:mod:`~end2end.simulate.cost.allocator`)
_EXPANDABLE = dict(default="", expandable=" (expandable segments)")


def _values(spec, layout, results, profile) -> Dict[str, Any]:
    """The row's fields from the simulated ranks and the time model."""
    from end2end.models.flops import mfu, tflops_per_rank, train_flops_per_sample
    from end2end.simulate.cost.allocator import allocator_mode, fragmentation, needed_bytes
    from end2end.simulate.cost.timing import overlapped_kinds, rank_seconds, step_seconds

    info = spec.mode_info
    kinds = overlapped_kinds(info.framework, info.slapo)
    on_node = min(spec.n, profile.gpus_per_node)  # ranks sharing a machine (cpu: threads)
    per_rank = [rank_seconds(r.ops, r.collectives, profile, kinds, on_node) for r in results]
    step = step_seconds([t["total"] for t in per_rank], layout.pp, layout.num_microbatches)
    peak = max(r.memory["peak"] for r in results)
    need = needed_bytes(peak, profile)
    thrpt = spec.batch_size / step
    flops = train_flops_per_sample(spec.model, spec.seq_len, spec.dec_seq_len)
    rate = profile.rate(spec.torch_dtype_name)
    status = "sim" if need <= profile.memory_bytes else "sim-oom"
    error = "" if status == "sim" else (
        f"predicted {need / 1e9:.1f} GB per rank (peak {peak / 1e9:.1f} GB + "
        f"{fragmentation(profile):.0%} allocator overhead{_EXPANDABLE[allocator_mode()]} + "
        f"{profile.reserved_bytes / 1e9:.1f} GB reserved) > {profile.memory_bytes / 1e9:.0f} GB")
    extra = dict(simulated=True, profile=profile.name, calibration=profile.provenance,
                 allocator=allocator_mode(),
                 modelled=results[0].modelled,
                 extrapolated=results[0].extrapolated,
                 attention=_attention_text(results, profile),
                 first_step_only=[r.first_step_only for r in results],
                 layout=layout.as_record(), roles=[r.rank for r in results],
                 memory=[r.memory for r in results], timing=per_rank,
                 totals=[r.totals for r in results], needed_bytes=need,
                 collectives=[_collective_summary(r.collectives, kinds) for r in results],
                 train_flops_per_sample=flops)
    return dict(status=status, error=error, thrpt=thrpt, step_time=step,
                per_gpu_mem=(profile.measured_fixed_bytes
                             + peak * (1 + profile.measured_overhead)) / 1e9,
                per_gpu_param=max(r.parameters for r in results) / 1e6,
                per_gpu_tflops=tflops_per_rank(thrpt, flops, spec.n),
                mfu=mfu(thrpt, flops, spec.n, rate), peak_tflops=rate / 1e12, extra=extra)


def _attention_text(results, profile) -> str:
    """What the rows' JSON says of attention: the kernels CUDA's rules chose on the simulated
    GPU (:mod:`end2end.simulate.cost.kernels`), or this CPU's."""
    if profile.eager is not None:
        return "as on this CPU"
    chosen: Dict[str, int] = {}
    for r in results:
        for kind, calls in r.attention.items():
            chosen[kind] = chosen.get(kind, 0) + calls
    major, minor = profile.compute_capability
    calls = ", ".join(f"{k} x{v}" for k, v in sorted(chosen.items())) or "no SDPA call"
    return f"PyTorch's SDPA rules for sm{major}{minor}: {calls}"


def _collective_summary(collectives, overlapped) -> List[Dict[str, Any]]:
    """Collectives grouped by (kind, group size, phase): calls, bytes, overlapped or not."""
    groups: Dict[tuple, Dict[str, Any]] = {}
    for c in collectives:
        key = (c.kind, c.group_size, c.phase)
        g = groups.setdefault(key, dict(kind=c.kind, group_size=c.group_size, phase=c.phase,
                                        calls=0, bytes=0, overlapped=c.kind in overlapped))
        g["calls"] += c.weight
        g["exposed_calls"] = g.get("exposed_calls", 0) + (c.weight if c.exposed else 0)
        g["bytes"] += c.bytes * c.weight
    return list(groups.values())


def simulate_run(spec, profile_name: str, calibration: str = "", timeout: float = 900,
                 environ: Optional[Dict[str, Optional[str]]] = None) -> Dict[str, Any]:
    """Simulate ``spec`` in a worker process (see the module docstring); the row's fields.
    ``environ``: variables set for the worker (``None``: unset), e.g. the allocator's
    configuration a run is launched with."""
    cmd = [sys.executable, "-m", "end2end.simulate.engine.worker", profile_name, calibration]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               CUDA_VISIBLE_DEVICES="")
    for name, value in (environ or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    try:
        proc = subprocess.run(cmd, input=spec.to_json(), capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return dict(status="timeout", error=f"simulation took over {timeout:.0f} s",
                    extra=dict(simulated=True))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return dict(status="fail", error=f"simulator crashed (exit {proc.returncode}): "
                    + " | ".join(tail), extra=dict(simulated=True, stderr=proc.stderr[-4000:]))
    return json.loads(lines[-1])


def in_order(tasks: Sequence[Callable[[], T]], jobs: int = 1) -> Iterator[Tuple[T, float]]:
    """Each task's result and its own wall seconds, in the order of ``tasks``, ``jobs`` tasks
    run at a time (threads: each task is expected to wait on a process of its own, e.g.
    :func:`simulate_run`); a task that finishes early waits for the earlier ones. Leaving the
    loop (an error, an interrupt) cancels the tasks not yet started."""
    def timed(task: Callable[[], T]) -> Tuple[T, float]:
        began = time.perf_counter()
        result = task()
        return result, time.perf_counter() - began

    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        futures = [pool.submit(timed, task) for task in tasks]
        for future in futures:
            yield future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def simulate_runs(specs: Sequence, profile_name: str, calibration: str = "",
                  timeout: float = 900, jobs: int = 1
                  ) -> Iterator[Tuple[Any, Dict[str, Any], float]]:
    """``(spec, fields, wall seconds)`` of every run of ``specs``, in their order, ``jobs`` runs
    simulated at a time (each in its worker process, :func:`simulate_run`, through
    :func:`in_order`). A simulation keeps one core busy (Python on fake tensors), so on a
    machine of ``jobs`` cores a config's runs take about ``1 / jobs`` of the time."""
    tasks = [functools.partial(simulate_run, spec, profile_name, calibration, timeout)
             for spec in specs]
    for spec, (values, seconds) in zip(specs, in_order(tasks, jobs)):
        yield spec, values, seconds
