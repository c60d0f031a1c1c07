"""The multi-node launcher is as safe as the sweep (issue 28): on "nodes" named localhost (one
torchrun agent each, one gloo rank each, tiny models) a node killed mid-run, a node that never
starts, a hung job hitting ``--timeout`` and Ctrl-C/SIGTERM each leave one row per run (or, when
interrupted, none, with the "resume with" line and exit 130) and no process behind; a resumed
launch re-runs only what has no ``ok`` row; a second launcher on the same results refuses."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from end2end.results.store import read_results
from end2end.sweep.multi_node import main as multi_node_main

from .processes import command_line, driver_ranks, free_port

ROOT = Path(__file__).resolve().parents[3]
LONG = "#@ steps=1000000 warmup=0\neager tiny/bert 2 16 0 4 0\n"  # runs until stopped
SHORT = "#@ steps=1 warmup=0\nslapo tiny/bert 2 16 0 4 0\n"
LONG3 = "#@ steps=1000000 warmup=0\neager tiny/bert 3 16 0 6 0\n"  # 3 nodes of 1 rank
THREE = "localhost,localhost,localhost"


def _argv(cfg: Path, res: Path, hosts: str = "localhost,localhost", *extra: str):
    return ["--hosts", hosts, "--gpus-per-node", "1", "--device", "cpu", "--config", str(cfg),
            "--results", str(res), "--port", str(free_port()), "--workdir", str(ROOT), *extra]


def _start(argv):
    """The launcher as a process of its own (own process group, as in a terminal)."""
    return subprocess.Popen([sys.executable, "-m", "end2end.multi_node.launch", *argv], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for_ranks(proc, ranks: int, seen: dict) -> list:
    """Wait until ``ranks`` driver processes train below the launcher; return every process
    below it (``seen`` collects them, by pid, for the no-process-left check)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        kids = psutil.Process(proc.pid).children(recursive=True)
        seen.update({k.pid: k for k in kids})
        workers = driver_ranks(kids)
        if len(workers) >= ranks:
            time.sleep(2)  # into set-up / training
            return psutil.Process(proc.pid).children(recursive=True)
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError("the ranks never started")


def _all_gone(pids) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.2)
    return False


def _rows(res: Path):
    return [(r.impl, r.status, r.error) for r in read_results(res).rows] if res.exists() else []


def _finish(proc, timeout=120):
    return proc.communicate(timeout=timeout)


def _kill_all(proc, seen: dict) -> None:
    """A failed test must not leave the job behind: SIGKILL the launcher's group and every
    process seen below it (the node commands run in sessions of their own)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for child in seen.values():  # a psutil.Process: never signals a reused pid
        try:
            child.kill()
        except psutil.Error:
            pass


def test_a_killed_node_gives_a_row_naming_it_and_the_next_run_completes(tmp_path, capsys):
    cfg, res = tmp_path / "c.cfg", tmp_path / "r.tsv"
    cfg.write_text(LONG3 + SHORT)
    argv = _argv(cfg, res, THREE, "--timeout", "300")
    proc, seen = _start(argv), {}
    try:
        kids = _wait_for_ranks(proc, 3, seen)
        agent1 = min((k for k in kids if "--rdzv_conf=is_host=0," in command_line(k)),
                     key=lambda k: k.pid)  # started second: node 1
        node1 = [agent1] + agent1.children(recursive=True)  # the whole machine "dies"
        for p in node1:
            p.kill()
        out, err = _finish(proc)
    finally:
        _kill_all(proc, seen)
    assert proc.returncode == 1, (out, err)
    (first, second) = _rows(res)
    assert first[:2] == ("eager", "fail") and "node 1 (localhost)" in first[2], first
    assert "SIGKILL" in first[2] and ".node1.log" in first[2]
    assert second[:2] == ("slapo", "ok")
    assert _all_gone(seen), "processes of the job were left behind"
    # resume: fail rows count as done, as in the sweep; --retry-failed re-runs only the run
    # without an ok row (that a resumed run really runs is the "next run" above)
    assert multi_node_main(argv + ["--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("# 0 run(s)")
    assert multi_node_main(argv + ["--dry-run", "--retry-failed"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# 1 run(s)") and "eager" in out and "slapo" not in out


def test_a_node_that_never_starts_and_a_hung_job_each_give_a_row(tmp_path, monkeypatch):
    cfg, res = tmp_path / "c.cfg", tmp_path / "r.tsv"
    cfg.write_text(LONG)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))  # no ssh at all: the remote node cannot start
    mine = psutil.Process()
    # helpers that earlier tests of this worker left running (e.g. multiprocessing's resource
    # tracker) are not this test's to judge: only processes started from here on are
    before = {p.pid for p in mine.children(recursive=True)}
    assert multi_node_main(_argv(cfg, res, "localhost,ghost")) == 1
    (row,) = _rows(res)
    assert row[1] == "fail" and row[2].startswith("node 1 (ghost) did not start: ssh: "), row
    # an ssh that cannot reach the host: exit code 255 and ssh's message in the row
    (bin_dir / "ssh").write_text("#!/bin/sh\necho \"ssh: connect to host $4 port 22: "
                                 "Connection refused\" >&2\nexit 255\n")
    (bin_dir / "ssh").chmod(0o755)
    assert multi_node_main(_argv(cfg, res, "localhost,ghost", "--retry-failed")) == 1
    row = _rows(res)[-1]
    assert row[1] == "fail" and "node 1 (ghost): exit code 255: ssh: connect to host ghost" \
        in row[2], row
    # a node that never joins the rendezvous: the first node's agent gives up after
    # --join-timeout, and the row says so, naming the node that was still running
    (bin_dir / "ssh").write_text("#!/bin/sh\nexec /bin/sleep 600\n")
    assert multi_node_main(_argv(cfg, res, "localhost,ghost", "--retry-failed",
                                 "--join-timeout", "5")) == 1
    row = _rows(res)[-1]
    assert row[1] == "fail" and row[2].startswith(
        "node 0 (localhost): rendezvous timeout: not every node joined (still running: "
        "node 1 (ghost);"), row
    monkeypatch.undo()
    assert len(_rows(res)) == 3
    # a job that hangs (never finishes its steps) is stopped on every node by --timeout
    cfg.write_text(LONG3)
    start, res = time.monotonic(), tmp_path / "hung.tsv"
    assert multi_node_main(_argv(cfg, res, THREE, "--timeout", "20")) == 1
    assert time.monotonic() - start < 60
    (row,) = _rows(res)
    assert row[1] == "timeout" and row[2].startswith(
        "timed out after 20s; still running: node 0 (localhost), node 1 (localhost), "
        "node 2 (localhost)"), row
    assert _all_gone([p.pid for p in mine.children(recursive=True) if p.pid not in before])


def test_a_rendezvous_port_in_use_gives_a_row_saying_so(tmp_path):
    cfg, res = tmp_path / "c.cfg", tmp_path / "r.tsv"
    cfg.write_text(SHORT)
    with socket.socket() as held:  # another process listening on the port
        held.bind(("", 0))
        held.listen()
        argv = _argv(cfg, res)
        argv[argv.index("--port") + 1] = str(held.getsockname()[1])
        assert multi_node_main(argv) == 1
    ((impl, status, error),) = _rows(res)
    assert status == "fail" and error.startswith(
        "node 0 (localhost): the rendezvous port is in use on localhost (another job or "
        "process holds it): pass a free one with --port (exit code 1; log: "), error


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_stops_every_node_keeps_nothing_and_says_how_to_resume(tmp_path, capsys,
                                                                             sig):
    cfg, res = tmp_path / "c.cfg", tmp_path / "r.tsv"
    cfg.write_text(LONG)
    proc, seen = _start(_argv(cfg, res)), {}
    try:
        _wait_for_ranks(proc, 2, seen)
        if sig == signal.SIGINT:  # a second launcher on the same results refuses at once
            assert multi_node_main(_argv(cfg, res, "localhost,localhost", "--dry-run")) == 0
            capsys.readouterr()
            assert multi_node_main(_argv(cfg, res)) == 2
            err = capsys.readouterr().err
            assert "is in use by sweep pid" in err and "--wait" in err, err
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        else:
            proc.send_signal(signal.SIGTERM)  # `kill PID`: only the launcher gets it
        out, err = _finish(proc, 180)  # a hang guard: ~15 s alone, over 60 s at load ~12
    finally:
        _kill_all(proc, seen)
    assert proc.returncode == 130, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "resume with: python -m end2end.multi_node.launch --hosts " \
        "localhost,localhost" in lines[0], err
    assert _all_gone(seen), "node commands were left behind"
    assert _rows(res) == []


def test_repeat_rounds_and_resume_in_dry_run(tmp_path, capsys):
    cfg, res = tmp_path / "c.cfg", tmp_path / "r.tsv"
    cfg.write_text(SHORT + "eager tiny/bert 2 16 0 4 0\n")
    assert multi_node_main(_argv(cfg, res, "localhost,localhost", "--repeat", "2",
                                 "--dry-run")) == 0
    out = capsys.readouterr().out
    assert out.startswith("# 4 run(s) for 2 node(s) x 1 GPUs")
    labels = [ln for ln in out.splitlines() if ln.startswith("# ") and "(tp, pp, dp)" in ln]
    assert [("slapo" in ln, "eager" in ln) for ln in labels] == [(1, 0), (0, 1)] * 2
    with pytest.raises(SystemExit) as exit_:
        multi_node_main(_argv(cfg, res, "localhost,localhost", "--timeout", "0"))
    assert exit_.value.code == 2 and "--timeout" in capsys.readouterr().err
