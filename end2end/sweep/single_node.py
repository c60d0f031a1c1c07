"""Run every line of a benchmark config through the driver, resumably.

    python -m end2end.sweep end2end/configs/cpu.cfg --results results/cpu.tsv
    python -m end2end.sweep CONFIG --results FILE --dry-run      # print the commands
    python -m end2end.sweep CONFIG --estimate                    # FLOP-based time estimate

For each run not yet in the results file (see ``results.pending_runs``; ``--retry-failed``
re-runs fail/timeout rows) it starts ``torchrun ... -m end2end.bench ... --results FILE`` with a
timeout, logging to ``<results>.logs/``. The driver appends the row itself; if it dies without
one, the sweep appends a ``fail``/``timeout`` row with the log's last line, and runs that need
more devices than available get a ``skipped`` row: every run of the config ends as a row.

The sweep watches the machine over every run (:mod:`end2end.sweep.quiet`) and writes the verdict
into the run's row (column ``Machine``: ``quiet (...)``/``busy (...)``); ``--require-quiet``
waits, at most ``--quiet-wait`` seconds, for a quiet machine before each run, or refuses.

Ctrl-C/SIGTERM stop the current run with its whole process tree (:mod:`end2end.sweep.procs`), cut
the results file back to where the run started, print how to resume and exit 130; the sweep
holds :class:`~end2end.sweep.lock.SweepLock` on the results file for its lifetime. Exit status:
0 all runs ok, 1 some not ok, 2 usage/config error, 130 interrupted (``--help``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from slapo.errors import ConfigError

from end2end.cli import HelpFormatter, configure_logging, get_logger, number
from end2end.spec.config_file import RunSpec, interleave, load_runs
from end2end.sweep.commands import shell_join, single_node_command
from end2end.sweep.procs import run_logged, signal_death
from end2end.sweep.progress import Progress, format_duration
from end2end.results.store import ResultRow, append_result, env_columns, mark, rollback
from end2end.sweep.options import add_quiet_options, add_sweep_options
from end2end.sweep.lock import SweepLock
from end2end.sweep.quiet import Watch, record_verdict, wait_until_quiet
from end2end.sweep.outcome import (check_timeout, last_line, log_path, not_ok, pending, rows_for,
                                   run_interruptible, settle_row, signal_name)

__all__ = ["estimate_run_seconds", "run_sweep", "check_timeout", "build_parser", "main"]

STARTUP_S = {1: 8.0, 2: 14.0}  # rough process start + imports + init on 2 CPU cores
TORCHRUN = (sys.executable, "-m", "torch.distributed.run")  # torchrun of this interpreter
log = get_logger("end2end.sweep")  # status and warnings (end2end.cli, "Logging")


def estimate_run_seconds(spec: RunSpec, flops_per_s: float = 150e9,
                         efficiency: float = 0.5) -> float:
    """Start-up plus (warm-up + measured) steps at ``flops_per_s * efficiency``."""
    from end2end.models.flops import estimate_step_seconds

    steps = (spec.steps or 40) + (spec.warmup if spec.warmup is not None else 5)
    step = estimate_step_seconds(spec.model, spec.batch_size, spec.seq_len, spec.dec_seq_len,
                                 flops_per_s, efficiency)
    return STARTUP_S.get(spec.n, 20.0) + steps * step


def _default_devices(device: str) -> int:
    if device == "cuda":
        import torch

        return torch.cuda.device_count()
    return os.cpu_count() or 1


def _failure_reason(rc: int, timed_out: bool, timeout: float, log: Path) -> str:
    if timed_out:
        return f"timed out after {format_duration(timeout)} (log: {log})"
    if rc is not None and rc < 0:
        return f"the launcher was killed by {signal_name(-rc)} (log: {log})"
    killed = signal_death(log)
    if killed:
        return f"{killed} (exit code {rc}; log: {log})"
    return f"exit code {rc}: {last_line(log)} (log: {log})"


def run_sweep(config: str, results: str, max_devices: Optional[int] = None,
              device: str = "cpu", retry_failed: bool = False, timeout: float = 1800.0,
              dry_run: bool = False, error_stop: bool = False,
              extra: Sequence[str] = (), wait: bool = False, repeat: int = 1,
              require_quiet: Optional[float] = None) -> int:
    """Run the pending runs of ``config``; returns how many runs of the config have no ``ok``
    row afterwards (failed, skipped, or not run because of ``error_stop``).

    ``repeat`` > 1 runs the config in interleaved rounds
    (:func:`end2end.spec.config_file.interleave`). ``require_quiet`` (seconds): before each run,
    wait at most that long for a quiet machine, else raise
    :class:`~end2end.sweep.quiet.MachineBusy` (finished runs stay; the same command resumes).
    Holds :class:`~end2end.sweep.lock.SweepLock` on ``results`` for the whole sweep (refuses,
    or with ``wait`` queues, when another sweep uses it). A ``KeyboardInterrupt`` (Ctrl-C, or
    SIGTERM under :func:`main`) stops the current run with every process it started, removes
    whatever that run wrote to the results file, and propagates: the run is pending again.
    """
    timeout = check_timeout(timeout)
    max_devices = max_devices or _default_devices(device)
    if max_devices < 1:
        raise ConfigError(f"max_devices is {max_devices}", hint="give --max-devices 1 or more")
    runs = interleave(load_runs(config, max_devices=max_devices), repeat)
    if not runs:
        raise ConfigError(f"{config}: no runs (the file is empty or has only comments)",
                          hint="add lines 'MODE MODEL GPUS SEQ_LEN DEC_SEQ_LEN BATCH_SIZE CKPT' "
                               "(end2end/README.md, Config grammar)")
    out = Path(results)
    extra = ["--device", device, *extra]
    if dry_run:
        for spec in pending(runs, out, retry_failed, max_devices):
            print(shell_join(single_node_command(spec, str(out), extra, TORCHRUN)))
        return 0
    with SweepLock(out, wait=wait, on_wait=lambda owner: log.info(
            "%s is in use by %s; waiting (--wait)", out, owner)):
        todo = pending(runs, out, retry_failed, max_devices)
        log.info("%s: %d runs, %d already in %s, %d to run", config, len(runs),
                 len(runs) - len(todo), out, len(todo))
        _run_all(todo, out, max_devices, timeout, error_stop, extra, device,
                 require_quiet)
        bad = not_ok(runs, out)
    if bad:
        log.info("%d of %d runs not ok: %s", sum(bad.values()), len(runs),
                 ", ".join(f"{n} {status}" for status, n in sorted(bad.items())))
    return sum(bad.values())


def _run_all(todo: Sequence[RunSpec], out: Path, max_devices: int, timeout: float,
             error_stop: bool, extra: Sequence[str], device: str,
             quiet_wait: Optional[float] = None) -> None:
    from end2end.results.environment import env_dump

    env = env_dump(device)
    progress = Progress(len(todo), weights=[estimate_run_seconds(s) for s in todo])
    for spec in todo:
        progress.start(spec.label)
        if spec.n > max_devices:
            row = ResultRow.from_spec(spec, "skipped", error=f"needs {spec.n} devices, "
                                      f"{max_devices} available", **env_columns(env))
            append_result(out, row, env)
            progress.finish("skipped")
            continue
        if quiet_wait is not None:
            wait_until_quiet(quiet_wait, log.info)
        before, start = rows_for(out, spec), mark(out)
        run_log = log_path(out, spec)
        try:
            with Watch() as watch:
                rc, timed_out = run_logged(single_node_command(spec, str(out), extra, TORCHRUN),
                                           run_log, timeout)
        except BaseException:
            rollback(out, start)  # nothing of the interrupted run stays: it is redone
            raise
        # a rank stopped by the timeout, or the peer of a rank killed by a signal, may have
        # written a row blaming the wrong thing ("connection closed"): ours says why
        killed = timed_out or bool(rc != 0 and signal_death(run_log))
        status = settle_row(out, spec, before, start, killed, timed_out,
                            _failure_reason(rc, timed_out, timeout, run_log), env)
        progress.finish(status, record_verdict(out, start, watch.verdict))
        if error_stop and status == "fail":
            log.info("stopping at the first failure (--error-stop)")
            break
    progress.summary()


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m end2end.sweep`` command line (every option documented)."""
    p = argparse.ArgumentParser(
        prog="python -m end2end.sweep", formatter_class=HelpFormatter,
        description="Run every line of a benchmark config through the driver (end2end.bench), "
                    "one row per run, resumable: start it again to continue.",
        epilog="Exit status: 0 every run of the config has an ok row; 1 some runs are not ok "
               "(fail/oom/timeout/skipped, or not run after --error-stop); 2 usage or config "
               "error (also: another sweep holds the results file); 130 interrupted (Ctrl-C or "
               "SIGTERM: the current run is stopped with all its processes, nothing of it is "
               "kept, and the same command resumes).")
    p.add_argument("config", help="config file (end2end/configs/*.cfg; grammar in "
                                  "end2end/README.md)")
    add_sweep_options(p, "results/results.tsv", "its JSON twin .jsonl, logs in FILE.logs/ and "
                      "the sweep's lock FILE.lock go next to it")
    p.add_argument("--max-devices", type=number(int, minimum=1), default=None,
                   help="GPUs/ranks available (pow2 expansion; runs that need more get a "
                        "skipped row); default: all CUDA devices, or the CPU cores")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="device the driver trains on")
    p.add_argument("--error-stop", action="store_true", help="stop at the first fail row")
    add_quiet_options(p)
    p.add_argument("--profile", metavar="DIR", default=None,
                   help="each run profiles one extra step after its timed ones (end2end.bench "
                   "--profile DIR; compare with python -m end2end.profiling)")
    p.add_argument("--mem-budget-gb", type=number(float, above=0), default=None, metavar="G",
                   help="each run's memory budget per rank (end2end.bench --mem-budget-gb): a "
                        "run whose peak per rank exceeds it ends as an oom row")
    p.add_argument("--estimate", action="store_true",
                   help="print a FLOP-based runtime estimate of every run and exit")
    p.add_argument("--gflops", type=number(float, above=0), default=150.0,
                   help="GEMM rate (GFLOP/s) assumed by --estimate")
    p.add_argument("--efficiency", type=number(float, above=0), default=0.5,
                   help="fraction of --gflops a training step reaches, for --estimate")
    return p


def _estimate(args: argparse.Namespace) -> None:
    runs = load_runs(args.config, max_devices=args.max_devices or 8)
    total = 0.0
    for spec in runs:
        sec = estimate_run_seconds(spec, args.gflops * 1e9, args.efficiency)
        total += sec
        print(f"{spec.label:60s} ~{format_duration(sec)}")
    print(f"{len(runs)} runs, ~{format_duration(total)} at {args.gflops:g} GFLOP/s x "
          f"{args.efficiency:g} (start-up included)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status (see ``--help``'s epilog)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)

    def run() -> int:
        if args.estimate:
            _estimate(args)
            return 0
        extra = ["--profile", args.profile] if args.profile else []
        if args.mem_budget_gb is not None:
            extra += ["--mem-budget-gb", str(args.mem_budget_gb)]
        bad = run_sweep(args.config, args.results, args.max_devices, args.device,
                        args.retry_failed, args.timeout, args.dry_run, args.error_stop,
                        extra=extra,
                        wait=args.wait, repeat=args.repeat,
                        require_quiet=args.quiet_wait if args.require_quiet else None)
        return 1 if bad else 0

    return run_interruptible("end2end.sweep", argv, run, args.debug)


if __name__ == "__main__":
    sys.exit(main())
