"""Interrupting a sweep and running two sweeps on one results file (issue 19, rows 1 and 2).

A real sweep process trains a 2-rank run under torchrun; a Ctrl-C (SIGINT to its process group,
as a terminal sends it) must stop the launcher *and* the ranks (which torchrun starts in
sessions of their own), keep nothing of the run, print one line that says how to resume and
exit 130; a second sweep on the same file meanwhile refuses. The resumed sweep runs the line
once. SIGTERM (``kill PID``) is handled the same way.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from end2end.results.store import read_results
from end2end.sweep.single_node import main as sweep_main
from end2end.sweep.single_node import run_sweep

from .processes import driver_ranks

ROOT = Path(__file__).resolve().parents[3]


def _start_sweep(cfg: Path, res: Path, ranks_wanted: int, sigint_ignored: bool = False):
    """Start ``python -m end2end.sweep`` in its own process group (``sigint_ignored``: with
    SIGINT ignored, as a parent that ignores it passes on); wait until the launcher and its
    ranks run; return (process, pids of every process below the sweep)."""
    cmd = [sys.executable, "-m", "end2end.sweep", str(cfg), "--results", str(res),
           "--max-devices", "2", "--timeout", "300"]
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=ignore)
    deadline = time.monotonic() + 120
    pids = []
    while time.monotonic() < deadline:
        kids = psutil.Process(proc.pid).children(recursive=True)
        workers = driver_ranks(kids)
        if len(workers) >= ranks_wanted:
            pids = [k.pid for k in kids]
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    assert pids, "the ranks never started"
    time.sleep(2)  # let the ranks get into set-up / training
    return proc, pids


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _rows(res: Path):
    return read_results(res).rows if res.exists() else []


def test_ctrl_c_stops_all_ranks_keeps_nothing_and_resume_runs_once(tmp_path, capsys):
    cfg, res = tmp_path / "c.cfg", tmp_path / "r.tsv"
    cfg.write_text("#@ steps=1000000 warmup=0\neager tiny/bert 2 16 0 4 0\n")
    proc, pids = _start_sweep(cfg, res, 2)
    try:
        # a second sweep on the same results file refuses, at once, and runs nothing
        assert sweep_main([str(cfg), "--results", str(res), "--max-devices", "2",
                           "--timeout", "15"]) == 2
        err = capsys.readouterr().err
        assert "is in use by sweep pid" in err and "--wait" in err and "Traceback" not in err
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        out, err = proc.communicate(timeout=180)  # a hang guard; a loaded CI machine is slow
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "resume with: python -m end2end.sweep" in lines[0], err
    deadline = time.monotonic() + 10
    while not all(map(_gone, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(map(_gone, pids)), [p for p in pids if not _gone(p)]
    assert _rows(res) == []  # nothing of the interrupted run is kept
    # resume (short run now): the interrupted run is redone, once
    cfg.write_text("#@ steps=1 warmup=0\neager tiny/bert 2 16 0 4 0\n")
    assert run_sweep(str(cfg), str(res), max_devices=2, timeout=300) == 0
    assert [(r.impl, r.status) for r in _rows(res)] == [("eager", "ok")]
    assert not read_results(res).warnings
    assert run_sweep(str(cfg), str(res), max_devices=2) == 0  # nothing left, no duplicate
    assert len(_rows(res)) == 1


def test_sigterm_is_an_interrupt_too(tmp_path):
    cfg, res = tmp_path / "c.cfg", tmp_path / "r.tsv"
    cfg.write_text("#@ steps=1000000 warmup=0\neager tiny/bert 1 16 0 2 0\n")
    proc, pids = _start_sweep(cfg, res, 1)
    try:
        proc.send_signal(signal.SIGTERM)  # `kill PID`: only the sweep itself gets it
        out, err = proc.communicate(timeout=180)  # a hang guard; a loaded CI machine is slow
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "resume with:" in err and "Traceback" not in err
    time.sleep(0.5)
    assert all(map(_gone, pids)) and _rows(res) == []


def test_ctrl_c_interrupts_a_sweep_started_with_sigint_ignored(tmp_path):
    """A parent that ignores SIGINT (a script's background job, a test worker) passes that on;
    the sweep still stops on Ctrl-C instead of hanging with its ranks left running."""
    cfg, res = tmp_path / "c.cfg", tmp_path / "r.tsv"
    cfg.write_text("#@ steps=1000000 warmup=0\neager tiny/bert 1 16 0 2 0\n")
    proc, pids = _start_sweep(cfg, res, 1, sigint_ignored=True)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=180)  # a hang guard; a loaded CI machine is slow
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "resume with:" in err and "Traceback" not in err
    deadline = time.monotonic() + 10
    while not all(map(_gone, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(map(_gone, pids)) and _rows(res) == []


def test_wait_queues_behind_the_sweep_that_holds_the_file(tmp_path, capsys):
    from end2end.sweep.lock import SweepLock

    cfg, res = tmp_path / "c.cfg", tmp_path / "r.tsv"
    cfg.write_text("slapo cpu/bert 4 128 0 4 0\n")  # needs 4 devices: a skipped row, no spawn
    lock = SweepLock(res).acquire()
    threading.Timer(1.0, lock.release).start()
    start = time.monotonic()
    assert sweep_main([str(cfg), "--results", str(res), "--max-devices", "2", "--wait"]) == 1
    assert time.monotonic() - start >= 0.9
    out = capsys.readouterr().out
    assert "waiting (--wait)" in out and "1 to run" in out
    assert [r.status for r in _rows(res)] == ["skipped"]
