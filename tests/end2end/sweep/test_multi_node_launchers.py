"""DeepSpeed's launcher for real (issue 28, item 3): the ``--launcher deepspeed`` path runs a
tiny config on one ``localhost slots=2`` node (DeepSpeed's runner launches locally when the
hostfile has one host and ``--no_ssh_check`` is given; ``--no_local_rank`` because the driver
reads LOCAL_RANK from the environment). Several local nodes are refused in one line: DeepSpeed's
hostfile names each host once. With SLAPO_SSH_TESTS=1 and passwordless ssh to 127.0.0.2 (an sshd
on this machine), a node over real ssh trains and is stopped by a SIGTERM to the launcher."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from end2end.results.store import read_results
from end2end.sweep.multi_node import main as multi_node_main

from .processes import driver_ranks, free_port

ROOT = Path(__file__).resolve().parents[3]


def test_deepspeed_launcher_runs_a_localhost_node_for_real(tmp_path, capsys):
    cfg, res = tmp_path / "c.cfg", tmp_path / "r.tsv"
    cfg.write_text("#@ steps=1 warmup=0\nslapo tiny/bert 2 16 0 4 0\n")
    argv = ["--hosts", "localhost", "--gpus-per-node", "2", "--device", "cpu", "--launcher",
            "deepspeed", "--config", str(cfg), "--results", str(res), "--port",
            str(free_port()), "--workdir", str(ROOT), "--timeout", "300"]
    assert multi_node_main(argv) == 0
    out = capsys.readouterr().out
    assert "-m deepspeed.launcher.runner --hostfile=" in out and "--no_ssh_check" in out
    assert res.with_suffix(".hostfile").read_text() == "localhost slots=2\n"
    (row,) = read_results(res).rows
    assert (row.impl, row.status, row.world, row.tp) == ("slapo", "ok", 2, 2)
    # several "nodes" on this machine: one line naming the problem and the way out
    argv[1:4] = ["localhost,localhost", "--gpus-per-node", "1"]
    argv[argv.index("--results") + 1] = str(tmp_path / "other.tsv")
    assert multi_node_main(argv + ["--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("end2end.multi_node.launch: error: slapo tiny/bert n=2") and \
        "--launcher torchrun" in err and len(err.splitlines()) == 1, err


SSH_HOST = os.environ.get("SLAPO_SSH_HOST", "127.0.0.2")


def _procs_of(res: Path):
    """Every process on this machine whose command line names the results file (the node
    commands, local or started by sshd, and their ranks)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if str(res) in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


@pytest.mark.skipif(os.environ.get("SLAPO_SSH_TESTS") != "1",
                    reason="set SLAPO_SSH_TESTS=1 with passwordless ssh to SLAPO_SSH_HOST "
                           "(default 127.0.0.2; docs/cluster.md, 'ssh to this machine')")
def test_a_node_over_real_ssh_runs_and_is_stopped_by_sigterm(tmp_path):
    cfg, res = tmp_path / "c.cfg", tmp_path / "r.tsv"
    cfg.write_text("#@ steps=1 warmup=0\neager tiny/bert 2 16 0 4 0\n")
    argv = ["--hosts", f"localhost,{SSH_HOST}", "--gpus-per-node", "1", "--device", "cpu",
            "--config", str(cfg), "--results", str(res), "--port", str(free_port()),
            "--workdir", str(ROOT), "--timeout", "120",
            "--torchrun", f"{sys.executable} -m torch.distributed.run"]
    assert multi_node_main(argv) == 0
    assert [(r.status, r.world) for r in read_results(res).rows] == [("ok", 2)]
    # a long run, then SIGTERM: the node behind ssh stops too (ssh -tt: its torchrun gets SIGHUP)
    cfg.write_text("#@ steps=1000000 warmup=0\nslapo tiny/bert 2 16 0 4 0\n")
    proc = subprocess.Popen([sys.executable, "-m", "end2end.multi_node.launch", *argv], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(driver_ranks(_procs_of(res))) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "ranks never started"
            time.sleep(0.5)
        mine = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        remote = [p for p in _procs_of(res) if p.pid not in mine]  # started by sshd
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "resume with:" in err, err
    deadline = time.monotonic() + 15
    while _procs_of(res) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert remote and not _procs_of(res), _procs_of(res)
    assert len(read_results(res).rows) == 1
