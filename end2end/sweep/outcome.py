"""What every sweep (one node: :mod:`.single_node`; many: :mod:`.multi_node`) does around a run:
which runs are pending, where a run logs, the row a run gets when the driver wrote none, and how
an interrupted command line ends.

* :func:`pending` — the runs without a row (``retry_failed``: fail/timeout rows run again).
* :func:`settle_row` — after a run: keep the driver's row, or, when the run timed out or a rank
  died of a signal (the survivors may have written a row blaming the wrong thing), replace it by
  one that says what happened; a run whose driver wrote nothing gets a ``fail``/``timeout`` row.
  Every run of a config ends as a row.
* :func:`run_interruptible` — a command's ``main``: SIGTERM is handled like Ctrl-C (which
  interrupts even when SIGINT was inherited ignored); both end with
  one line on stderr that says how to resume, and exit status 130.
"""

from __future__ import annotations

import math
import re
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from slapo.errors import ConfigError

from end2end.cli import get_logger, report_errors
from end2end.results.store import (Mark, ResultRow, append_result, env_columns, pending_runs,
                                   read_results, rollback)
from end2end.spec.config_file import RunSpec
from end2end.sweep.commands import shell_join

__all__ = ["check_timeout", "log_path", "rows_for", "last_line", "not_ok", "pending",
           "signal_name", "settle_row", "run_interruptible"]


def check_timeout(timeout: float) -> float:
    """A per-run timeout must be a finite number of seconds > 0."""
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ConfigError(f"timeout {timeout!r} is not a positive number of seconds",
                          hint="give e.g. --timeout 1800 (the default)")
    return float(timeout)


def log_path(results: Path, spec: RunSpec, suffix: str = "") -> Path:
    """``<results>.logs/<run key>[suffix].log``: where a run's launcher output goes."""
    name = re.sub(r"[^A-Za-z0-9.=-]+", "_", "-".join(map(str, spec.key)))
    return results.parent / (results.name + ".logs") / f"{name}{suffix}.log"


def rows_for(results: Path, spec: RunSpec) -> int:
    """How many rows of ``results`` belong to ``spec`` (its key, repeat round included)."""
    if not results.exists():
        return 0
    return sum(1 for r in read_results(results, check_twin=False).rows if r.key == spec.key)


def last_line(log: Path) -> str:
    """The last error line of a log (else its last line): what a fail row quotes."""
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (errors or lines or [""])[-1].strip()


def not_ok(runs: Sequence[RunSpec], results: Path) -> Dict[str, int]:
    """Status counts of the runs whose latest row is not ``ok`` (``pending``: no row)."""
    latest = {}
    if results.exists():
        latest = {r.key: r.status for r in read_results(results, check_twin=False).rows}
    counts: Dict[str, int] = {}
    for spec in runs:
        status = latest.get(spec.key, "pending")
        if status != "ok":
            counts[status] = counts.get(status, 0) + 1
    return counts


def pending(runs: Sequence[RunSpec], out: Path, retry_failed: bool,
            devices: Optional[int]) -> List[RunSpec]:
    """The runs of ``runs`` that have no row in ``out`` yet (warnings about the file logged)."""
    if not out.exists():
        return list(runs)
    res = read_results(out)
    for warning in res.warnings:
        get_logger("end2end.sweep").warning("warning: %s", warning)
    return pending_runs(runs, res, retry_failed=retry_failed, devices=devices)


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def settle_row(out: Path, spec: RunSpec, before: int, start: Mark, replace: bool,
               timed_out: bool, reason: str, env: dict) -> str:
    """Make sure the run has exactly the row it deserves; returns its status.

    ``before``/``start``: the run's row count and the file's :func:`~end2end.results.store.mark`
    before it started. ``replace``: the run timed out or a rank was killed, so whatever the
    survivors wrote is cut away. With no row left, a ``timeout``/``fail`` row says ``reason``.
    """
    if replace:
        rollback(out, start)
    if rows_for(out, spec) == before:  # the driver wrote nothing: record why
        status = "timeout" if timed_out else "fail"
        append_result(out, ResultRow.from_spec(
            spec, status, error=reason, time=time.strftime("%Y-%m-%dT%H:%M:%S"),
            **env_columns(env)), env)
        return status
    last = [r for r in read_results(out, check_twin=False).rows if r.key == spec.key]
    return last[-1].status if last else "ok"


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt


def run_interruptible(prog: str, argv: Sequence[str], run: Callable[[], int],
                      debug: bool) -> int:
    """``report_errors(prog, run, debug)`` with SIGTERM handled as Ctrl-C: an interrupt (the
    sweep has stopped the current run with all its processes and cut its rows) prints
    ``interrupted: ...; resume with: python -m PROG ARGV`` and returns 130."""
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    # Ctrl-C interrupts even when this process was started with SIGINT ignored (a parent that
    # ignores it, a background job of a script): Python then installs no handler of its own
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return report_errors(prog, run, debug)
    except KeyboardInterrupt:
        print(f"\ninterrupted: the current run was stopped and nothing of it kept; resume with: "
              f"python -m {prog} {shell_join(argv)}", file=sys.stderr, flush=True)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
