"""``--launcher slurm`` (issue 28, item 2): ``--dry-run`` prints an sbatch script a Slurm user
submits as it is (always tested). With SLAPO_SLURM_TESTS=1 and a running Slurm controller and
daemon on this machine (recipe in docs/cluster.md; one node with 2 CPUs), the generated script
runs for real: a tiny run ends ``ok``, a job that hits its time limit gets a ``timeout`` row
naming Slurm's state, nothing of either job is left in the queue, and a SIGTERM to the launcher
cancels its running job (scancel) and keeps no row (~2-3 minutes)."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from end2end.results.store import read_results
from end2end.sweep.multi_node import main as multi_node_main

ROOT = Path(__file__).resolve().parents[3]
REAL = os.environ.get("SLAPO_SLURM_TESTS") == "1"


def _argv(cfg, res, *extra):
    return ["--launcher", "slurm", "--slurm-nodes", "1", "--gpus-per-node", "2", "--device",
            "cpu", "--config", str(cfg), "--results", str(res), "--workdir", str(ROOT), *extra]


def test_dry_run_prints_a_script_to_submit_as_it_is(tmp_path, capsys):
    cfg, res = tmp_path / "c.cfg", tmp_path / "r.tsv"
    cfg.write_text("#@ steps=1 warmup=0\nslapo tiny/bert 2 16 0 4 0\nslapo tiny/bert 4 16 0 4 0\n")
    assert multi_node_main(_argv(cfg, res, "--slurm-nodes", "2", "--timeout", "3700",
                                 "--partition", "debug", "--dry-run")) == 0
    out = capsys.readouterr().out
    scripts = out.split("#!/bin/bash\n")[1:]
    assert out.startswith("# 2 run(s) for 2 node(s) x 2 GPUs") and len(scripts) == 2
    script = scripts[1]  # the 4-rank run (two nodes), the last thing printed
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=2",
                 "#SBATCH --time=0-01:02:00", "#SBATCH --partition=debug", "set -euo pipefail",
                 'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'):
        assert line + "\n" in script, (line, script)
    srun = next(ln for ln in script.splitlines() if ln.startswith("srun "))
    assert '--rdzv_endpoint="$head":29500' in srun and '--rdzv_id="$SLURM_JOB_ID"' in srun
    assert "--nnodes=2" in srun and f"--results {res}" in srun
    if shutil.which("bash"):  # the script is valid shell
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert not res.exists() and not (tmp_path / "r.tsv.logs").exists()  # nothing written


@pytest.mark.skipif(not REAL, reason="set SLAPO_SLURM_TESTS=1 with Slurm running "
                                     "(docs/cluster.md, 'Slurm on one machine')")
def test_real_slurm_runs_the_script_and_records_every_job(tmp_path):
    assert subprocess.run(["sinfo"], capture_output=True).returncode == 0, "Slurm is not up"
    cfg, res = tmp_path / "c.cfg", tmp_path / "r.tsv"
    cfg.write_text("#@ steps=1 warmup=0\nslapo tiny/bert 2 16 0 4 0\n"
                   "#@ steps=1000000\neager tiny/bert 2 16 0 4 0\n")
    assert multi_node_main(_argv(cfg, res, "--timeout", "30")) == 1
    rows = read_results(res).rows
    assert [(r.impl, r.status) for r in rows] == [("slapo", "ok"), ("eager", "timeout")]
    assert "TIMEOUT (Reason=TimeLimit" in rows[1].error, rows[1].error
    queue = subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout
    assert "fig8-" not in queue, queue
    assert multi_node_main(_argv(cfg, res, "--timeout", "30")) == 1  # resumed: nothing to run
    assert len(read_results(res).rows) == 2
    # SIGTERM while a job runs: the job is cancelled, nothing is kept, exit 130
    res = tmp_path / "interrupted.tsv"
    cfg.write_text("#@ steps=1000000 warmup=0\neager tiny/bert 2 16 0 4 0\n")
    proc = subprocess.Popen([sys.executable, "-m", "end2end.multi_node.launch",
                             *_argv(cfg, res, "--timeout", "300")], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while "fig8-" not in subprocess.run(["squeue", "-h", "-t", "R", "-o", "%j"],
                                            capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline and proc.poll() is None, "the job never ran"
            time.sleep(0.5)
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "resume with:" in err, err
    time.sleep(2)
    assert "fig8-" not in subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout
    assert not res.exists() or not read_results(res).rows
