"""``python -m end2end.simulate.gpu_busy``: a measured GPU step split into the GPU's busy and idle
time from its profile, beside the prediction; on a synthetic profile and on the committed H200
runs (docs/results/gpu_h200)."""

from __future__ import annotations

import json
from pathlib import Path

from end2end.simulate.gpu_busy import busy_rows, format_busy, gpu_busy_us, main

ROOT = Path(__file__).resolve().parents[3]
H200 = ROOT / "docs" / "results" / "gpu_h200" / "check"


def test_busy_time_counts_gpu_activities_only():
    """Kernels, copies and memsets count; an op's GPU time (its kernels are entries of their
    own), a host call and a user annotation over kernels do not."""
    profile = {"ops": {
        "aten::mm": {"cpu_us": 30.0, "count": 2, "cuda_us": 100.0},
        "nvjet_sm90_gemm": {"cpu_us": 0, "count": 2, "cuda_us": 100.0},
        "Memcpy HtoD (Pageable -> Device)": {"cpu_us": 0, "count": 1, "cuda_us": 5.0},
        "Optimizer.step#AdamW.step": {"cpu_us": 0, "count": 1, "cuda_us": 40.0},
        "void multi_tensor_apply_kernel": {"cpu_us": 0, "count": 3, "cuda_us": 40.0},
        "cudaLaunchKernel": {"cpu_us": 12.0, "count": 5, "cuda_us": 0},
    }}
    assert gpu_busy_us(profile) == 145.0


def test_committed_h200_runs_each_get_a_line_with_their_profile_and_prediction():
    rows = busy_rows(H200 / "gpu_check.tsv", H200 / "gpu_check.h200.sim.tsv", H200 / "profiles")
    measured = [json.loads(line) for line in (H200 / "gpu_check.jsonl").read_text().splitlines()]
    assert len(rows) == sum(r.get("type") == "row" and r["Status"] == "ok" for r in measured)
    for row in rows:
        assert row["busy_ms"] and row["predicted"], row
        assert 0 < row["busy_ms"] < row["step_ms"] and 0 < row["idle"] < 1, row
        phases = row["predicted"]
        assert abs(phases["forward"] + phases["backward"] + phases["optimizer"]
                   - phases["step"]) < 1e-6 * phases["step"] + 1e-9, phases
    table = format_busy(rows)
    assert "eager bert-large-uncased n=1 s=512 b=16 ckpt=0" in table and "not measurements" in table


def test_missing_profile_and_prediction_are_said(tmp_path, capsys):
    rows = busy_rows(H200 / "gpu_check.tsv", H200 / "gpu_check.h200.sim.tsv", tmp_path)
    assert all(row["busy_ms"] is None and row["idle"] is None for row in rows)
    assert "no profile" in format_busy(rows)
    (tmp_path / "empty.tsv").write_text("")
    (tmp_path / "empty.jsonl").write_text("")
    rows = busy_rows(H200 / "gpu_check.tsv", tmp_path / "empty.tsv", H200 / "profiles")
    assert all(row["predicted"] is None for row in rows)
    assert "no prediction" in format_busy(rows)
    assert main([str(tmp_path / "nothing.tsv"), str(H200 / "gpu_check.h200.sim.tsv"),
                 "--profiles", str(tmp_path)]) == 1
    assert "JSON-lines twin" in capsys.readouterr().err
