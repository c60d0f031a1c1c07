"""The benchmark driver: one training run of one mode, measured in-process, one results row.

    torchrun --standalone --nproc_per_node N -m end2end.bench \\
        --mode MODE --model MODEL --seq-len S --dec-seq-len D --batch-size B --ckpt C \\
        --results FILE [--steps 40] [--warmup 5] [--dtype fp32|fp16|bf16 [--fp32-masters]] \\
        [--tp T] [--pp P] [--micro-batch-size M] [--device cpu|cuda] \\
        [--peak-tflops X] [--gemm-seconds 0.5] [--knob NAME=VALUE ...] [--repeat R] \\
        [--mem-budget-gb X] [--save-every N [--save-dir DIR]] [--resume DIR]

(``end2end.sweep`` and ``end2end.sweep.commands`` build this command line from a config line; a
plain ``python -m end2end.bench ...`` is a one-rank run.) Every mode goes through the same code:

1. the arguments become a validated :class:`~end2end.spec.config_file.RunSpec` (``make_run_spec``,
with
   ``n`` = the world size);
2. the mode's runtime is imported and a memory baseline taken; the machine's GEMM rate is
   measured on all ranks at once (after a barrier; ranks share a CPU host): the best of five
   windows per rank, averaged over ranks, unless ``--peak-tflops`` gives it (e.g. measured once
   per sweep);
3. the model is built from the zoo (:mod:`end2end.models`, random weights, no downloads); the
   Slapo modes get their model schedule (:mod:`slapo.model_schedule`: op-library SDPA
   attention, fusion, ``ckpt_ratio`` = CKPT; TP = the world size for ``slapo-megatron`` and
   ``slapo``, no TP under ZeRO-3 for ``slapo-deepspeed`` and FSDP2 for ``slapo-fsdp`` (unless
   ``--tp``: TP x FSDP); with ``--pp`` also the stage cuts;
   ``--knob NAME=VALUE`` adds recipe knobs, :mod:`end2end.spec.knobs`), and
   :func:`end2end.driver.runtimes.make_runner` wraps it in the mode's runtime;
4. ``warmup`` steps run untimed (compilations, e.g. of ``torch.compile`` fusions, happen there:
   the JSON twin's ``extra.build_seconds`` and ``extra.warmup_times`` report them apart), then
   ``steps`` timed steps (:class:`~end2end.driver.measure.StepTimer`: device sync + barrier around
   the
   window, the slowest rank's time);
5. rank 0 appends one row: samples/s (global batch x steps / time), step time, peak memory per
   rank (:class:`~end2end.driver.measure.PeakMemory`: CUDA max allocated, or on CPU the resident-set
   high-water mark over a post-import baseline), parameters stored per rank, model TFLOP/s per
   rank and MFU (:mod:`end2end.models.flops`), versions, commit, device, world/TP/PP/DP, status.

**Failures.** An exception on any rank becomes a row written by that rank: ``oom`` for an
out-of-memory error, else ``fail`` with the message (full traceback in the JSON twin). A key in
the job's rendezvous store makes sure only the first writer of a run writes, so a run has exactly
one row. The process then exits with status 1 (``torchrun`` stops the other ranks) so the sweep
sees it too. ``SLAPO_BENCH_FAULT`` injects faults for tests (:mod:`end2end.driver.measure`).
``--mem-budget-gb X`` makes a run whose peak memory per rank exceeds ``X`` GB an ``oom`` row,
like a CUDA OOM (on CPU the OOM is this budget; on CUDA the allocator is capped at it too).

Batches: a data-parallel rank trains on ``B / DP`` samples, tensor-parallel ranks on the same
batch (DP = n for ``deepspeed``/``slapo-deepspeed``/``eager``/``fsdp``/``slapo-fsdp``, TP = n for
the others, see ``RunSpec.parallel_sizes``); the batch is synthetic (``make_inputs``) and reused
every step.

Stop and resume (:mod:`end2end.driver.resume`): ``--save-every N`` writes the training state
(DCP) after every N-th step, ``--resume DIR`` continues a run from one: the remaining steps give
the uninterrupted run's losses, and the row's ``Resumed`` column (``from step k``) and
``extra.resumed`` say that and where it resumed.

Pipelines (``--pp P`` > 1; :mod:`end2end.driver.pipeline_plan`): ``slapo`` (torch pipeline dialect)
and ``slapo-deepspeed`` (DeepSpeed ``PipelineModule``) cut the model's layers into ``P`` even stages
through the recipe's ``pipeline_cuts``/``example_inputs`` knobs; the world is TP x DP x PP
(``--tp``, default 1), every rank of a replica gets the replica's batch, split into micro-batches
(``--micro-batch-size``; default ``P`` of them when they divide). Other modes refuse ``--pp`` with
a ``ConfigError`` (a ``fail`` row) naming what to use instead. Throughput, memory, parameters per
rank (the rank's stage) and FLOPs are measured exactly as for the other modes. Without a
pipeline, ``--micro-batch-size`` below the rank's batch is gradient accumulation in every mode
(:func:`end2end.driver.builders.plain_torch_step`).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import os
import sys
import time
import traceback
from dataclasses import replace
from typing import Any, Dict, Optional, Sequence

__all__ = ["run_bench", "spec_from_args", "parse_args", "main", "DEFAULTS", "knob_text"]

DEFAULTS = dict(steps=40, warmup=5, dtype="fp32")
_RUN_COUNTER = itertools.count()  # distinguishes several runs in one process (tests)


def build_parser() -> argparse.ArgumentParser:
    """The driver's command line (every option documented; numbers checked here)."""
    from end2end.cli import HelpFormatter, add_workload_arguments, number
    from end2end.spec.modes import MODE_TABLE
    from end2end.spec.runspec import DTYPES

    p = argparse.ArgumentParser(
        prog="python -m end2end.bench", formatter_class=HelpFormatter,
        description="Train one benchmark run and append its row to --results (under torchrun: "
                    "one process per rank). Invalid arguments exit 2 without a row; a failed "
                    "run is a fail/oom row and exit 1.")
    p.add_argument("--mode", required=True, choices=tuple(MODE_TABLE),
                   help="the system: " + "; ".join(f"{m.name}: {m.description}"
                                                   for m in MODE_TABLE.values()))
    add_workload_arguments(p)
    p.add_argument("--ckpt", default="0", help="activation checkpointing as in a config line's "
                   "CKPT: a ratio in [0, 1] or op (selective, every layer) for Slapo modes, "
                   "0/full/selective for megatron, "
                   "0/1 for deepspeed/eager")
    p.add_argument("--results", required=True, help="results TSV to append the row to")
    p.add_argument("--steps", type=number(int, minimum=1), default=None,
                   help=f"timed training steps, >= 1 (default: {DEFAULTS['steps']})")
    p.add_argument("--warmup", type=number(int, minimum=0), default=None,
                   help=f"untimed steps before them, >= 0 (default: {DEFAULTS['warmup']})")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                   help=f"parameter/activation dtype (default: {DEFAULTS['dtype']})")
    p.add_argument("--fp32-masters", action="store_true", default=None,
                   help="with --dtype fp16/bf16: the plain-PyTorch modes (eager, slapo, "
                        "slapo-auto) keep fp32 master weights and optimizer states, as apex's "
                        "O2 (the other modes keep them anyway)")
    p.add_argument("--tp", type=number(int, minimum=1), default=None,
                   help="tensor-parallel size (default: the mode's layout, see README)")
    p.add_argument("--pp", type=number(int, minimum=1), default=None,
                   help="pipeline stages; > 1 pipelines the slapo/slapo-deepspeed modes "
                        "(default: 1)")
    p.add_argument("--micro-batch-size", type=number(int, minimum=1), default=None,
                   help="micro-batch per rank: below the rank's batch, gradient "
                        "accumulation (every mode) or a pipeline's micro-batches (default: P "
                        "micro-batches when they divide the rank's batch, else one)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="training device (default: CUDA when available)")
    p.add_argument("--peak-tflops", type=number(float, above=0), default=None,
                   help="per-rank peak TFLOP/s for MFU; skips the in-run GEMM measurement "
                        "(default: measured)")
    p.add_argument("--gemm-seconds", type=number(float, above=0), default=0.5,
                   help="duration of the in-run GEMM-rate measurement")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                   help="a model-schedule knob of the Slapo modes (repeatable), e.g. "
                   "shard_embedding=False; recorded in the Knobs column and the run's key")
    p.add_argument("--repeat", type=number(int, minimum=0), default=0,
                   help="index of an interleaved repeat (part of the run's key)")
    p.add_argument("--mem-budget-gb", type=number(float, above=0), default=None,
                   help="peak memory per rank allowed (GB); above it the run is an oom row, "
                   "like a CUDA OOM (CPU: the OOM is this budget; CUDA: the allocator is also "
                   "capped at it). Default: no budget")
    p.add_argument("--profile", metavar="DIR", default=None,
                   help="after the timed steps, profile one more step on every rank and write "
                   "DIR/<run>.rank<R>.json/.txt (self time per op; compare runs with python -m "
                   "end2end.profiling)")
    p.add_argument("--no-keep-freed-memory", dest="keep_freed_memory", action="store_false",
                   help="CPU: leave glibc's malloc thresholds alone (default: "
                   "slapo.keep_freed_memory(), the same for every mode)")
    from end2end.driver.resume import add_arguments

    add_arguments(p)  # --save-every N, --save-dir DIR, --resume DIR
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse the driver's command line (exit 2 with a message on a bad value)."""
    return build_parser().parse_args(argv)


def spec_from_args(args: argparse.Namespace, world_size: int):
    """The validated RunSpec of the command line, with defaults filled in."""
    from end2end.spec.config_file import make_run_spec

    spec = make_run_spec(args.mode, args.model, world_size, args.seq_len, args.dec_seq_len,
                         args.batch_size, args.ckpt, steps=args.steps, warmup=args.warmup,
                         dtype=args.dtype, tp=args.tp, pp=args.pp,
                         micro_batch=args.micro_batch_size, repeat=args.repeat,
                         fp32_masters=args.fp32_masters)
    spec = replace(spec, knobs=knob_text(args.knob))  # checked in the run: a bad knob is a row
    return replace(spec, **{k: v for k, v in DEFAULTS.items() if getattr(spec, k) is None})


def knob_text(items: Sequence[str]) -> str:
    """The canonical knob text, or (when the knobs do not even parse) the items as typed, so
    that the failed run still has a key and a row."""
    from slapo.errors import ConfigError

    from end2end.spec.knobs import format_knobs

    try:
        return format_knobs(items)
    except ConfigError:
        return ",".join(sorted(items))


def _claim_row(run_id: int) -> bool:
    """True for the first rank of this job to claim the run's row (rendezvous store)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            store = dist.distributed_c10d._get_default_store()
            return store.add(f"end2end.bench/row/{run_id}", 1) == 1
        except Exception:  # noqa: BLE001  (no store reachable: fall back to rank 0)
            pass
    return int(os.environ.get("RANK", "0")) == 0


def _log():
    """The driver's status and diagnostics (``end2end.bench: ...``; rank 0, errors on every
    rank: :func:`end2end.cli.get_logger`)."""
    from end2end.cli import get_logger

    return get_logger("end2end.bench")


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def _measure(spec, layout, args: argparse.Namespace, extra: Dict[str, Any]):
    """Build, warm up, time; returns the row's metric fields (collective over all ranks)."""
    from slapo.runtime.distributed import init_distributed

    from end2end.driver.assemble import build_runner, rank_batch

    env = init_distributed()
    memory, peak = _prepare(spec, args, env.device, extra)
    low = spec.low_precision_dtype
    built = time.perf_counter()
    runner = build_runner(spec, layout, low, env.device)
    extra["build_seconds"] = round(time.perf_counter() - built, 3)
    batch = rank_batch(spec, layout, env.rank, env.device, low)
    timed = _train(runner, batch, spec, args, memory, env, extra)
    del runner, batch
    return _metrics(spec, layout, timed, peak, extra)


def _prepare(spec, args: argparse.Namespace, device, extra: Dict[str, Any]):
    """Before the build: malloc settings, the mode's framework imported, the memory budget, the
    memory baseline and the machine's GEMM rate. Returns (PeakMemory, peak FLOP/s per rank)."""
    from end2end.driver.assemble import import_runtime
    from end2end.driver.measure import PeakMemory, limit_cuda_memory

    if device.type == "cpu" and args.keep_freed_memory:
        import slapo

        extra["keep_freed_memory"] = slapo.keep_freed_memory()
    import_runtime(spec.mode, bool(spec.fp32_masters))
    limit_cuda_memory(device, args.mem_budget_gb)
    if args.mem_budget_gb is not None:
        extra["mem_budget_gb"] = args.mem_budget_gb
    memory = PeakMemory(device)
    memory.mark_baseline()
    peak = args.peak_tflops * 1e12 if args.peak_tflops else _gemm_rate(
        device, spec.torch_dtype, args.gemm_seconds)
    return memory, peak


def _gemm_rate(device, dtype, seconds: float) -> float:
    """The machine's GEMM rate (FLOP/s per rank) for MFU, measured by all ranks at once (they
    share a CPU host): the best of five windows per rank (a shared host only slows down),
    averaged over ranks."""
    import torch

    from end2end.driver.measure import StepTimer, all_reduce_float
    from end2end.models.flops import measure_gemm_flops

    StepTimer(device).start()  # barrier: all ranks measure the shared machine at once
    size = 4096 if device.type == "cuda" else 1024
    gemm_dtype = dtype if device.type == "cuda" else torch.float32
    rates = [measure_gemm_flops(device, gemm_dtype, size=size, seconds=seconds / 5,
                                warmup=1 if i else 3) for i in range(5)]
    return all_reduce_float(max(rates), "avg")


def _train(runner, batch, spec, args: argparse.Namespace, memory, env,
           extra: Dict[str, Any]) -> Dict[str, Any]:
    """Warm-up (untimed: compilations happen here), then the timed steps, then the optional
    profiled step; the budget is checked after each phase. Returns the timing and memory."""
    import torch

    from end2end.driver.measure import (StepTimer, all_reduce_float, check_memory_budget,
                                        local_parameters, maybe_inject_fault)
    from end2end.driver.resume import Checkpointer

    params = all_reduce_float(local_parameters(runner.model), "max")
    states = Checkpointer(args, spec)
    done = states.restore(runner, extra, spec.warmup + spec.steps)  # steps already done
    memory.start()
    maybe_inject_fault(env.rank)
    losses, warmup_times = [], []
    for i in range(done, spec.warmup):
        began = time.perf_counter()
        losses.append(runner.train_step(batch))
        warmup_times.append(round(time.perf_counter() - began, 5))
        states.after_step(runner, i + 1, extra)
    if args.mem_budget_gb is not None and spec.warmup:  # fail fast: skip the timed steps
        check_memory_budget(all_reduce_float(memory.peak_bytes(), "max"), args.mem_budget_gb,
                            "in warm-up")
    timer = StepTimer(env.device)
    timer.start()
    timed_steps = range(max(done - spec.warmup, 0), spec.steps)
    for i in timed_steps:
        losses.append(runner.train_step(batch))
        timer.lap()
        states.after_step(runner, spec.warmup + i + 1, extra)  # (counted in the next lap)
    elapsed = timer.stop()
    if args.profile:
        import functools

        from end2end.driver.profiling import profile_step

        step = functools.partial(runner.train_step, batch)
        extra["profile"] = str(profile_step(step, args.profile, spec.label, env.rank,
                                            env.device.type == "cuda"))
    mem = all_reduce_float(memory.peak_bytes(), "max")
    check_memory_budget(mem, args.mem_budget_gb, "in warm-up and timed steps")
    extra.update(losses=[round(x, 5) for x in losses],
                 step_times=[round(t, 5) for t in timer.step_times],
                 memory_method=memory.method, warmup=spec.warmup, warmup_times=warmup_times,
                 threads=torch.get_num_threads())
    if not all(map(lambda x: x == x and abs(x) != float("inf"), losses)):
        raise FloatingPointError(f"non-finite loss: {losses}")
    return dict(elapsed=elapsed, params=params, mem=mem, steps=len(timed_steps))


def _metrics(spec, layout, timed: Dict[str, Any], peak: float,
             extra: Dict[str, Any]) -> Dict[str, Any]:
    """The row's metric fields from the timed window (and the batch layout in ``extra``)."""
    from end2end.models.flops import mfu, tflops_per_rank, train_flops_per_sample

    elapsed, steps = timed["elapsed"], timed.get("steps", spec.steps)  # fewer when resumed
    thrpt = spec.batch_size * steps / elapsed
    flops = train_flops_per_sample(spec.model, spec.seq_len, spec.dec_seq_len)
    record = layout.as_record()
    extra.update(train_flops_per_sample=flops, local_batch=record["local_batch"],
                 microbatches=record["microbatches"], micro_batch=record["micro_batch"])
    return dict(thrpt=thrpt, per_gpu_param=timed["params"] / 1e6,
                per_gpu_mem=timed["mem"] / 1e9,
                per_gpu_tflops=tflops_per_rank(thrpt, flops, spec.n),
                mfu=mfu(thrpt, flops, spec.n, peak), step_time=elapsed / steps,
                peak_tflops=peak / 1e12)


def run_bench(args: argparse.Namespace) -> int:
    """One run on this rank (collective over the job); returns the exit status (0 = ok).

    Callable several times in one process group (tests); each call writes exactly one row.
    """
    from slapo.runtime.distributed import init_distributed, teardown

    from end2end.spec.knobs import check_run_knobs
    from end2end.spec.layout import run_layout
    from end2end.driver.measure import is_oom
    from end2end.models import get_model_spec

    run_id = next(_RUN_COUNTER)
    spec, rank, extra = None, int(os.environ.get("RANK", "0")), {}
    start = time.time()
    try:
        env = init_distributed()
        rank = env.rank
        spec = spec_from_args(args, env.world_size)
        check_run_knobs(spec.mode, get_model_spec(spec.model).schedule, spec.knobs)
        if args.device == "cuda" and env.device.type != "cuda":
            raise RuntimeError("--device cuda but no CUDA device is available")
        extra["loadavg_start"] = list(os.getloadavg())
        values = _measure(spec, run_layout(spec), args, extra)
        status, error = "ok", ""
    except Exception as exc:  # noqa: BLE001  (every failure becomes a row)
        status = "oom" if is_oom(exc) else "fail"
        error = f"rank {rank}: {type(exc).__name__}: {exc}"
        extra["traceback"] = traceback.format_exc()
        _log().error("%s: %s", status, error, exc_info=True)
        values = {}
    try:
        return _write_row(args, spec, run_id, rank, status, error, values, extra, start)
    finally:
        teardown()  # megatron state, DeepSpeed comm, the default group if we created it


def _write_row(args, spec, run_id: int, rank: int, status: str, error: str,
               values: Dict[str, Any], extra: Dict[str, Any], start: float) -> int:
    """Rank 0 (ok) or the first failing rank appends the row; returns the exit status."""
    from end2end.results.environment import env_dump
    from end2end.driver.resume import resumed_cell
    from end2end.results.store import ResultRow, append_result, env_columns

    if spec is None:  # the arguments themselves are invalid: nothing to key a row by
        _log().error("no row written (%s)", error)
        return 2
    if status == "ok" and rank != 0:
        return 0
    if not _claim_row(run_id):
        return 0 if status == "ok" else 1
    env_info = env_dump(args.device)
    extra.update(loadavg_end=list(os.getloadavg()), wall_s=round(time.time() - start, 2),
                 hostname=env_info.get("hostname", ""))
    row = ResultRow.from_spec(spec, status, time=_now(), error=error, extra=extra,
                              dtype=spec.dtype, steps=spec.steps, resumed=resumed_cell(extra),
                              **values, **env_columns(env_info))
    append_result(args.results, row, env_info)
    if status == "ok":
        _log().info("%s: %.3f samples/s, step %.3f s, %.3f GB/rank, MFU %.3f", spec.label,
                    values["thrpt"], values["step_time"], values["per_gpu_mem"], values["mfu"])
    return 0 if status == "ok" else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")  # a plain one-rank run (DeepSpeed insists on it)
    args = parse_args(argv)
    if args.device == "cpu":  # before anything touches CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    return run_bench(args)


if __name__ == "__main__":
    sys.exit(main())
