"""Start one launcher (``torchrun``) and stop it with everything it started.

Why this is not just ``killpg``: the sweep starts the launcher in its own session so that a
Ctrl-C in the terminal reaches only the sweep, but ``torchrun`` in turn starts every rank in a
session of its own. Killing the launcher's process group leaves the ranks running (the bug
of issue 19: an interrupted sweep kept training in the background). :func:`stop_tree` therefore
signals the launcher's group *and* every descendant process (found with ``psutil``, which
deepspeed already depends on), waits, and kills what is left.

:func:`run_logged` runs a command with its output in a log file and a timeout;
:func:`signal_death` reads the launcher's log for a rank that a signal killed, so that a row
says ``rank 1 killed by SIGKILL`` instead of torchrun's ``error_file: <N/A>``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import psutil

__all__ = ["run_logged", "run_group", "GroupOutcome", "stop_tree", "signal_death", "GRACE_S"]

GRACE_S = 10.0  # seconds between SIGTERM and SIGKILL


def _descendants(pid: int) -> List[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_all(procs: Sequence[psutil.Process], sig: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def stop_tree(proc: subprocess.Popen, grace: float = GRACE_S) -> List[int]:
    """Stop ``proc`` (started with ``start_new_session=True``) and every process below it:
    SIGTERM to the launcher's group and to each descendant, then SIGKILL after ``grace``
    seconds to whatever is still alive. Returns the pids that were stopped."""
    tree = [psutil.Process(proc.pid)] if proc.poll() is None else []
    tree += _descendants(proc.pid)
    pids = [p.pid for p in tree]
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    _signal_all(tree, signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=grace)
    alive += [p for p in _descendants(proc.pid) if p.pid not in pids]  # started meanwhile
    if alive:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _signal_all(alive, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=grace)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:  # pragma: no cover (SIGKILL cannot be ignored)
        pass
    return pids + [p.pid for p in alive if p.pid not in pids]


def run_logged(cmd: Sequence[str], log: Path, timeout: Optional[float]) -> Tuple[int, bool]:
    """Run ``cmd`` in its own session with stdout+stderr to ``log`` (first line: the command).

    Returns ``(returncode, timed_out)``. On a timeout, and on any exception while waiting
    (``KeyboardInterrupt`` from Ctrl-C or the sweep's SIGTERM handler), the whole process tree
    is stopped before this returns or re-raises, so no rank outlives the call.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.Popen(list(cmd), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            stop_tree(proc)
            return proc.returncode, True
        except BaseException:
            with _signals_ignored():
                stop_tree(proc)
            raise


@dataclass
class GroupOutcome:
    """How the commands of :func:`run_group` ended: ``codes[i]`` is command i's exit status
    (negative: killed by that signal; None: it never started, or the group stopped it while it
    still ran), ``start_errors[i]`` why command i could not start, ``failed`` the commands that
    ended on their own with a non-zero status (in the order seen), ``timed_out`` whether the
    timeout stopped the group, ``stopped`` the commands the group stopped."""

    codes: List[Optional[int]]
    start_errors: Dict[int, str] = field(default_factory=dict)
    failed: List[int] = field(default_factory=list)
    timed_out: bool = False
    stopped: List[int] = field(default_factory=list)


def _start(cmd: Sequence[str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        return subprocess.Popen(list(cmd), stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _stop_group(procs: Sequence[Optional[subprocess.Popen]],
                seen: Dict[int, psutil.Process], grace: float) -> None:
    """Stop every command and every process ever seen below one (a rank whose launcher died
    is reparented away from it, so the tree alone would miss it)."""
    for proc in procs:
        if proc is not None:
            stop_tree(proc, grace)
    left = [p for p in seen.values() if p.is_running()]
    _signal_all(left, signal.SIGKILL)
    psutil.wait_procs(left, timeout=grace)


def run_group(cmds: Sequence[Sequence[str]], logs: Sequence[Path], timeout: float,
              grace: float = GRACE_S, poll_s: float = 0.2) -> GroupOutcome:
    """Run the commands of one job together (one per node), each in its own session with its
    output in its log, until all succeed, one fails, or ``timeout`` seconds pass; then stop
    every one still running with all its processes. A command that cannot start (no ``ssh``)
    fails the group at once. An exception while waiting (Ctrl-C) stops everything, re-raised."""
    procs: List[Optional[subprocess.Popen]] = []
    out = GroupOutcome(codes=[None] * len(cmds))
    seen: Dict[int, psutil.Process] = {}
    try:
        for i, (cmd, log) in enumerate(zip(cmds, logs)):
            try:
                procs.append(_start(cmd, log))
            except OSError as exc:
                procs.append(None)
                out.start_errors[i] = f"{cmd[0]}: {exc.strerror or exc}"
        deadline = time.monotonic() + timeout
        while not out.start_errors:
            for proc in procs:
                seen.update((p.pid, p) for p in _descendants(proc.pid) if p.pid not in seen)
            for i, proc in enumerate(procs):
                if proc.poll() not in (None, 0) and i not in out.failed:
                    out.failed.append(i)
            if out.failed or all(p.poll() is not None for p in procs):
                break
            if time.monotonic() > deadline:
                out.timed_out = True
                break
            time.sleep(poll_s)
        if out.failed:
            time.sleep(min(1.0, grace))  # let a peer's death show in the logs and codes
            out.failed += [i for i, p in enumerate(procs)
                           if p.poll() not in (None, 0) and i not in out.failed]
        out.stopped = [i for i, p in enumerate(procs) if p is not None and p.poll() is None]
        out.codes = [None if p is None or i in out.stopped else p.returncode
                     for i, p in enumerate(procs)]
        _stop_group(procs, seen, grace)
        return out
    except BaseException:
        with _signals_ignored():
            _stop_group(procs, seen, grace)
        raise


class _signals_ignored:
    """Ignore SIGINT/SIGTERM for a moment (a second Ctrl-C must not interrupt the clean-up)."""

    def __enter__(self):
        self.saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)", re.M)
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.M)


def signal_death(log: Path) -> Optional[str]:
    """``rank 1 killed by SIGKILL`` when the root cause in torchrun's failure summary in
    ``log`` is a rank whose exit code is a negative signal number; None otherwise. (The other
    ranks of the summary died of the SIGTERM torchrun sent them afterwards.)"""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    root = text[text.rfind("Root Cause"):] if "Root Cause" in text else text
    rank, code = _RANK.search(root), _EXITCODE.search(root)
    if not rank or not code or int(code.group(1)) >= 0:
        return None
    number = -int(code.group(1))
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return f"rank {rank.group(1)} killed by {name}"
