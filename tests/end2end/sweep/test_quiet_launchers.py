"""The quiet-machine guard beyond the single-node sweep (issue 38 item 2): the Figure 8 launcher
and the tuner's measured candidates (``autotune.driver``) record the machine's verdict in each
row and flag a busy one; ``--require-quiet`` refuses a busy machine in one line (the tuner stops
without storing the candidate). A busy machine is made as in ``test_quiet.py``: a CPU-heavy
process beside the test (the ``hog`` fixture)."""

import json
import subprocess
import sys
from pathlib import Path

from end2end.results.store import read_results, twin_path
from end2end.sweep.multi_node import main as multi_node_main
from slapo.autotune import load_records

from .processes import free_port

ROOT = Path(__file__).resolve().parents[3]
ONE_RANK = "#@ steps=1 warmup=1\neager tiny/bert 1 16 0 2 0\n"
CANDIDATE = ["--mode", "eager", "--model", "tiny/bert", "--gpus", "1", "--seq-len", "16",
             "--batch-size", "2", "--ckpt", "0", "--steps", "1", "--warmup", "1",
             "--device", "cpu"]


def _run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def _one_error_line(run: subprocess.CompletedProcess) -> str:
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    return lines[0]


def test_the_multi_node_launcher_flags_a_busy_machine_and_require_quiet_refuses(tmp_path, hog):
    cfg = tmp_path / "one.cfg"
    cfg.write_text(ONE_RANK)
    launch = ["end2end.multi_node.launch", "--hosts", "localhost", "--gpus-per-node", "1",
              "--device", "cpu", "--config", str(cfg), "--port", str(free_port()),
              "--workdir", str(ROOT)]
    results = tmp_path / "r.tsv"
    run = _run(*launch, "--results", str(results))
    assert run.returncode == 0, run.stderr[-2000:]
    (row,) = read_results(results, strict=True).rows
    assert row.status == "ok" and row.machine.startswith("busy ("), row.machine
    record = json.loads(twin_path(results).read_text().splitlines()[-1])
    assert hog.pid in [p["pid"] for p in record["extra"]["machine"]["busy_processes"]]
    assert "measured while the machine was busy" in run.stdout + run.stderr

    refused = tmp_path / "refused.tsv"
    run = _run(*launch, "--results", str(refused), "--require-quiet", "--quiet-wait", "0")
    line = _one_error_line(run)
    assert run.returncode == 2 and line.startswith(
        "end2end.multi_node.launch: error: the machine is busy (") and "--quiet-wait" in line
    assert not refused.exists()


def test_require_quiet_is_refused_for_slurm_jobs(tmp_path, capsys):
    assert multi_node_main(["--launcher", "slurm", "--require-quiet",
                            "--results", str(tmp_path / "r.tsv")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--require-quiet cannot watch the nodes of a slurm job" in line


def test_a_tuning_candidate_records_the_busy_machine_and_require_quiet_stops_the_tuner(
        tmp_path, hog):
    results = tmp_path / "r.tsv"
    run = _run("autotune.driver", *CANDIDATE, "--results", str(results))
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["status"] == "ok" and result["machine"].startswith("busy ("), result
    (row,) = read_results(results, strict=True).rows
    assert row.machine == result["machine"]

    # the driver alone: one line, exit 75, no run, no row
    refused = tmp_path / "refused.tsv"
    run = _run("autotune.driver", *CANDIDATE, "--results", str(refused), "--require-quiet",
               "--quiet-wait", "0")
    assert run.returncode == 75 and not run.stdout.strip(), run
    assert _one_error_line(run).startswith("autotune.driver: error: the machine is busy (")
    assert not refused.exists()

    # under the tuner: the study stops in one line, the candidate is not stored as measured
    space, db = tmp_path / "space.py", tmp_path / "s.db"
    space.write_text("from slapo.autotune import Space\nspace = Space('one')\n"
                     "space.choice('ckpt_ratio', [0])\n")
    run = _run("slapo.autotune", "--space", str(space), "--strategy", "grid", "--db", str(db),
               "--", sys.executable, "-m", "autotune.driver", *CANDIDATE, "--results",
               str(refused), "--require-quiet", "--quiet-wait", "0")
    line = _one_error_line(run)
    assert run.returncode == 2 and "refused to evaluate" in line \
        and "the machine is busy (" in line, line
    assert not [r for r in load_records(str(db), "grid") if r.evaluated]
