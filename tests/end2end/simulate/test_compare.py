"""``python -m end2end.simulate.compare``: measured runs beside their predictions (what
scripts/gpu_check.sh prints after its sweep), on synthetic rows and on a real simulation of a
tiny config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from end2end.results.store import ResultRow, append_result, read_results
from end2end.simulate.compare import format_table, main, side_by_side
from end2end.spec.config_file import load_runs, make_run_spec

ROOT = Path(__file__).resolve().parents[3]
TINY = """#@ steps=2 warmup=1 dtype=bf16
eager tiny/gpt2 1 32 0 4 0
slapo tiny/gpt2 1 32 0 4 0
"""


def _spec(mode: str, repeat: int = 0, batch: int = 4):
    return make_run_spec(mode, "tiny/gpt2", 1, 32, 0, batch, "0", steps=2, dtype="bf16",
                         repeat=repeat)


def _row(spec, status: str, device: str, thrpt=None, mem=None, error=""):
    return ResultRow.from_spec(spec, status, thrpt=thrpt, per_gpu_mem=mem, device=device,
                               error=error, time="t")


def test_repeats_median_statuses_and_missing_runs(tmp_path):
    measured, simulated = tmp_path / "m.tsv", tmp_path / "s.tsv"
    for repeat, thrpt in enumerate((10.0, 14.0, 12.0)):
        append_result(measured, _row(_spec("eager", repeat), "ok", "GPU", thrpt, 2.0 + repeat))
    append_result(measured, _row(_spec("slapo"), "fail", "GPU", error="RuntimeError: boom"))
    sim = "h200 (simulated)"
    append_result(simulated, _row(_spec("eager"), "sim", sim, 20.0, 4.0))
    append_result(simulated, _row(_spec("slapo"), "sim-oom", sim, 30.0, 200.0,
                                  error="predicted 221 GB per rank"))
    append_result(simulated, _row(_spec("eager", batch=8), "sim", sim, 25.0, 5.0))
    rows = side_by_side(measured, simulated)
    assert [r["label"] for r in rows] == [
        "eager tiny/gpt2 n=1 s=32 b=4 ckpt=0", "slapo tiny/gpt2 n=1 s=32 b=4 ckpt=0",
        "eager tiny/gpt2 n=1 s=32 b=8 ckpt=0"]  # measured runs first, repeats as one
    eager, slapo, only_predicted = rows
    assert eager["measured"]["thrpt"] == 12.0 and eager["measured"]["mem"] == 3.0  # medians
    assert eager["thrpt_ratio"] == pytest.approx(12.0 / 20.0)
    assert eager["mem_ratio"] == pytest.approx(3.0 / 4.0)
    assert slapo["thrpt_ratio"] is None and slapo["measured"]["status"] == "fail"
    assert only_predicted["measured"] is None and only_predicted["thrpt_ratio"] is None
    text = format_table(rows, "h200")
    assert "measured on GPU; predicted for h200 (simulated)" in text
    lines = text.splitlines()
    assert "0.60" in lines[3] and "0.75" in lines[3] and "20 (predicted)" in lines[3]
    assert "fail: RuntimeError: boom" in lines[4] and "(predicted, OOM)" in lines[4]
    assert "no row" in lines[5]


def test_missing_file_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path / "none.tsv"), str(tmp_path / "none.sim.tsv")]) == 1
    assert "none.tsv does not exist" in capsys.readouterr().err


@pytest.mark.timeout(600)
def test_measured_rows_beside_a_real_h200_simulation(tmp_path):
    """The tiny config simulated for h200 by the simulator's command line (as gpu_check.sh
    does), synthetic measured rows of the same runs, then the comparison's command line."""
    config = tmp_path / "tiny.cfg"
    config.write_text(TINY)
    simulated, measured = tmp_path / "tiny.h200.sim.tsv", tmp_path / "tiny.tsv"
    subprocess.run([sys.executable, "-m", "end2end.simulate", str(config), "--device", "h200",
                    "--results", str(simulated), "--timeout", "300", "--jobs", "2"], cwd=ROOT,
                   check=True, capture_output=True, timeout=600)
    rows = read_results(simulated).rows  # two at a time, written in the config's order
    assert [r.impl for r in rows] == [s.mode for s in load_runs(str(config))]
    predicted = {r.impl: r for r in rows}
    assert {r.status for r in predicted.values()} == {"sim"}
    assert all(r.device == "h200 (simulated)" and r.thrpt > 0 for r in predicted.values())
    for spec, thrpt in zip(load_runs(str(config)), (1000.0, 1500.0)):
        append_result(measured, _row(spec, "ok", "NVIDIA H200", thrpt, 0.5))
    out = subprocess.run([sys.executable, "-m", "end2end.simulate.compare", str(measured),
                          str(simulated), "--profile", "h200"], cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    lines = out.splitlines()
    assert lines[0].startswith("measured on NVIDIA H200; predicted for h200 (simulated)")
    for line, mode, thrpt in zip(lines[3:], ("eager", "slapo"), (1000.0, 1500.0)):
        p = predicted[mode]
        assert line.startswith(f"{mode} tiny/gpt2 n=1 s=32 b=4 ckpt=0")
        assert f"{p.thrpt:.3g} (predicted)" in line and f"{p.per_gpu_mem:.3g} (predicted)" in line
        assert f"{thrpt / p.thrpt:.2f}" in line and f"{0.5 / p.per_gpu_mem:.2f}" in line
