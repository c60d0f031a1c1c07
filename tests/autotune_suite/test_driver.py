"""The Figure 10 suite (autotune/): the benchmark driver as the tuner's objective.

The memory budget of ``end2end.bench`` (``--mem-budget-gb``) turns a run into an ``oom`` row,
exactly like a CUDA OOM; ``python -m slapo.autotune`` drives real tiny driver runs through
``autotune.driver`` (torchrun, one results row per candidate) and stores their outcomes; the
per-model space files load and every candidate is a valid run.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from autotune.driver import build_parser, config_text, run_candidate
from end2end.spec.config_file import make_run_spec
from end2end.driver.measure import MemoryBudgetExceeded, check_memory_budget, is_oom
from end2end.results.store import read_results
from slapo.autotune import load_records
from slapo.autotune.cli import load_space_file

ROOT = Path(__file__).resolve().parents[2]
SPACES = sorted((ROOT / "autotune" / "spaces").glob("*.py"))


def test_memory_budget_is_an_oom():
    check_memory_budget(2e9, None, "in warm-up")  # no budget: nothing to check
    check_memory_budget(2e9, 2.0, "in warm-up")  # at the budget: fits
    with pytest.raises(MemoryBudgetExceeded, match=r"peak 2.001 GB per rank in warm-up "
                       r"exceeds --mem-budget-gb 2") as info:
        check_memory_budget(2.001e9, 2.0, "in warm-up")
    assert is_oom(info.value)


def test_invalid_candidate_is_a_fail_result_and_config_text():
    args, extra = build_parser().parse_known_args(
        ["--mode", "slapo", "--model", "tiny/bert", "--gpus", "1", "--seq-len", "16",
         "--batch-size", "4", "--ckpt", "7", "--results", "unused.tsv", "--device", "cpu"])
    assert extra == ["--device", "cpu"]
    out = run_candidate(args, extra)
    assert out["status"] == "fail" and "CKPT ratio '7' is outside [0, 1]" in out["error"]
    spec = make_run_spec("slapo-megatron", "cpu/bert", 2, 256, 0, 8, "0.5", steps=2,
                         knobs="fuse_bias_gelu=False")
    assert config_text(spec) == ("#@ steps=2\n#@ knobs=fuse_bias_gelu=False\n"
                                 "slapo-megatron cpu/bert 2 256 0 8 0.5")


def test_tuner_over_real_driver_runs_budget_oom_and_ok(tmp_path):
    """Two candidates, identical but for the memory budget: 1 MB (any run exceeds it) and
    50 GB. The first is an ``oom`` row and trial, the second ``ok``, and the best is printed
    with the config line that reproduces it."""
    space = tmp_path / "space.py"
    space.write_text("from slapo.autotune import Space\n"
                     "space = Space('budget')\n"
                     "space.choice('mem_budget_gb', [0.001, 50])\n"
                     "space.choice('ckpt_ratio', [0.5])\n")
    results, db = tmp_path / "r.tsv", tmp_path / "s.db"
    cmd = [sys.executable, "-m", "slapo.autotune", "--space", str(space), "--strategy", "grid",
           "--db", str(db), "--timeout", "300", "--", sys.executable, "-m", "autotune.driver",
           "--mode", "slapo", "--model", "tiny/bert", "--gpus", "1", "--seq-len", "16",
           "--batch-size", "4", "--ckpt", "{ckpt_ratio}", "--results", str(results),
           "--steps", "1", "--warmup", "1", "--device", "cpu", "--gemm-seconds", "0.05",
           "--mem-budget-gb", "{mem_budget_gb}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600,
                          start_new_session=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_results(results).rows
    assert [r.status for r in rows] == ["oom", "ok"]
    assert "out of memory budget: peak" in rows[0].error and "--mem-budget-gb 0.001" \
        in rows[0].error and rows[0].thrpt is None
    assert rows[1].thrpt > 0 and 0 < rows[1].per_gpu_mem < 50
    records = load_records(str(db), "grid")
    assert [(r.status, r.params["mem_budget_gb"]) for r in records] == [("oom", 0.001),
                                                                       ("ok", 50)]
    assert records[1].throughput == pytest.approx(rows[1].thrpt)
    assert records[1].memory_gb == pytest.approx(rows[1].per_gpu_mem)
    assert "best: mem_budget_gb=50 ckpt_ratio=0.5" in proc.stdout
    assert "config line: #@ steps=1 warmup=1" in proc.stdout
    assert "slapo tiny/bert 1 16 0 4 0.5" in proc.stdout


@pytest.mark.parametrize("path", SPACES, ids=[p.stem for p in SPACES])
def test_model_spaces_are_valid_runs(path):
    ns = load_space_file(str(path))
    space, command = ns["space"], ns["command"]
    cands = space.candidates()
    assert len(cands) >= (6 if path.stem.startswith("tiny") else 12)
    assert {"batch_size", "ckpt_ratio"} <= set(space.names)
    assert "{batch_size}" in command
    if ns["MODEL"].startswith("cpu/"):  # on CPU the OOM is a budget; a GPU has its own
        assert "--mem-budget-gb" in command
    for c in cands:
        values = space.complete(c)
        spec = make_run_spec(ns["MODE"], ns["MODEL"], ns["GPUS"], ns["SEQ_LEN"], 0,
                             values["batch_size"], f"{values['ckpt_ratio']:g}")
        assert spec.batch_size == values["batch_size"]


def test_tuner_timeout_stops_the_driver_and_its_ranks(tmp_path):
    """The tuner's timeout sends SIGTERM to the driver's process group; the driver stops
    torchrun's whole tree (ranks run in sessions of their own), so no rank is left running."""
    import time

    import psutil

    from slapo.autotune import CommandObjective

    results = tmp_path / "r.tsv"
    obj = CommandObjective([sys.executable, "-m", "autotune.driver", "--mode", "slapo",
                            "--model", "tiny/bert", "--gpus", "1", "--seq-len", "16",
                            "--batch-size", "4", "--ckpt", "0", "--results", str(results),
                            "--steps", "100000", "--warmup", "1", "--device", "cpu",
                            "--gemm-seconds", "0.05"], timeout=12, cwd=str(ROOT))
    out = obj({})
    assert out.status == "timeout" and "no result after 12 s" in out.error
    time.sleep(1)
    left = [p for p in psutil.process_iter(["cmdline"])
            if str(results) in " ".join(p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]
