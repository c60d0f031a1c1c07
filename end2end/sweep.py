"""Run every line of a benchmark config through the driver, resumably.

    python -m end2end.sweep end2end/configs/cpu.cfg --results results/cpu.tsv
    python -m end2end.sweep CONFIG --results FILE --dry-run      # print the commands
    python -m end2end.sweep CONFIG --estimate                    # FLOP-based time estimate

For each run not yet in the results file (see ``results.pending_runs``; ``--retry-failed``
re-runs fail/timeout rows) it starts ``torchrun ... -m end2end.bench ... --results FILE`` with a
timeout, logging to ``<results>.logs/``. The driver appends the row itself; if it dies without
one, the sweep appends a ``fail``/``timeout`` row with the log's last line, and runs that need
more devices than available get a ``skipped`` row: every run of the config ends as a row.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from .config import RunSpec, load_runs
from .launch import shell_join, single_node_command
from .progress import Progress, format_duration
from .results import ResultRow, append_result, env_columns, pending_runs, read_results

__all__ = ["estimate_run_seconds", "run_sweep", "main"]

STARTUP_S = {1: 8.0, 2: 14.0}  # rough process start + imports + init on 2 CPU cores
TORCHRUN = (sys.executable, "-m", "torch.distributed.run")  # torchrun of this interpreter


def estimate_run_seconds(spec: RunSpec, flops_per_s: float = 150e9,
                         efficiency: float = 0.5) -> float:
    """Start-up plus (warm-up + measured) steps at ``flops_per_s * efficiency``."""
    from .flops import estimate_step_seconds

    steps = (spec.steps or 40) + (spec.warmup if spec.warmup is not None else 5)
    step = estimate_step_seconds(spec.model, spec.batch_size, spec.seq_len, spec.dec_seq_len,
                                 flops_per_s, efficiency)
    return STARTUP_S.get(spec.n, 20.0) + steps * step


def _default_devices(device: str) -> int:
    if device == "cuda":
        import torch

        return torch.cuda.device_count()
    return os.cpu_count() or 1


def _log_path(results: Path, spec: RunSpec) -> Path:
    name = re.sub(r"[^A-Za-z0-9.=-]+", "_", "-".join(map(str, spec.key)))
    return results.parent / (results.name + ".logs") / f"{name}.log"


def _rows_for(results: Path, spec: RunSpec) -> int:
    if not results.exists():
        return 0
    return sum(1 for r in read_results(results, check_twin=False).rows if r.key == spec.key)


def _run_one(cmd: List[str], log: Path, timeout: float) -> tuple:
    """Run ``cmd`` in its own session with output to ``log``; returns (returncode, timed_out)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        fh.write(shell_join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # the whole torchrun process group
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return proc.returncode, True


def _last_line(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (errors or lines or [""])[-1].strip()


def run_sweep(config: str, results: str, max_devices: Optional[int] = None,
              device: str = "cpu", retry_failed: bool = False, timeout: float = 1800.0,
              dry_run: bool = False, error_stop: bool = False,
              extra: Sequence[str] = ()) -> int:
    """Run the pending runs of ``config``; returns the number of runs that did not end ``ok``."""
    max_devices = max_devices or _default_devices(device)
    runs = load_runs(config, max_devices=max_devices)
    out = Path(results)
    todo = pending_runs(runs, out, retry_failed=retry_failed)
    print(f"{config}: {len(runs)} runs, {len(runs) - len(todo)} already in {out}, "
          f"{len(todo)} to run")
    extra = ["--device", device, *extra]
    if dry_run:
        for spec in todo:
            print(shell_join(single_node_command(spec, str(out), extra, TORCHRUN)))
        return 0
    from .env import env_dump

    env = env_dump(device)
    progress = Progress(len(todo), weights=[estimate_run_seconds(s) for s in todo])
    bad = 0
    for spec in todo:
        progress.start(spec.label)
        if spec.n > max_devices:
            row = ResultRow.from_spec(spec, "skipped", error=f"needs {spec.n} devices, "
                                      f"{max_devices} available", **env_columns(env))
            append_result(out, row, env)
            progress.finish("skipped")
            bad += 1
            continue
        before = _rows_for(out, spec)
        log = _log_path(out, spec)
        cmd = single_node_command(spec, str(out), extra, TORCHRUN)
        rc, timed_out = _run_one(cmd, log, timeout)
        status = "ok"
        if _rows_for(out, spec) == before:  # the driver wrote nothing: record why
            status = "timeout" if timed_out else "fail"
            reason = (f"timed out after {format_duration(timeout)}" if timed_out else
                      f"exit code {rc}: {_last_line(log)}") + f" (log: {log})"
            append_result(out, ResultRow.from_spec(spec, status, error=reason,
                                                   time=time.strftime("%Y-%m-%dT%H:%M:%S"),
                                                   **env_columns(env)), env)
        else:
            last = [r for r in read_results(out, check_twin=False).rows if r.key == spec.key]
            status = last[-1].status if last else status
        progress.finish(status)
        bad += status != "ok"
        if error_stop and status == "fail":
            print("stopping at the first failure (--error-stop)")
            break
    progress.summary()
    return bad


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Run a benchmark config (resumable).")
    parser.add_argument("config")
    parser.add_argument("--results", default="results/results.tsv")
    parser.add_argument("--max-devices", type=int, default=None,
                        help="GPUs/ranks available (pow2 expansion, skipping); default: all")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--retry-failed", action="store_true", help="re-run fail/timeout rows")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--error-stop", action="store_true", help="stop at the first fail")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--estimate", action="store_true",
                        help="print a FLOP-based runtime estimate and exit")
    parser.add_argument("--gflops", type=float, default=150.0, help="GEMM rate for --estimate")
    parser.add_argument("--efficiency", type=float, default=0.5, help="for --estimate")
    args = parser.parse_args(argv)
    if args.estimate:
        runs = load_runs(args.config, max_devices=args.max_devices or 8)
        total = 0.0
        for spec in runs:
            sec = estimate_run_seconds(spec, args.gflops * 1e9, args.efficiency)
            total += sec
            print(f"{spec.label:60s} ~{format_duration(sec)}")
        print(f"{len(runs)} runs, ~{format_duration(total)} at {args.gflops:g} GFLOP/s x "
              f"{args.efficiency:g} (start-up included)")
        return 0
    bad = run_sweep(args.config, args.results, args.max_devices, args.device,
                    args.retry_failed, args.timeout, args.dry_run, args.error_stop)
    return 1 if bad and args.error_stop else 0


if __name__ == "__main__":
    sys.exit(main())
