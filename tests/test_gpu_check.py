"""scripts/gpu_check.sh off the GPU: a clear exit 3, and its pieces (attention-kernel check,
figure) run on the CPU, so a session with a GPU does not spend device time on a broken script."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from end2end.spec.config_file import make_run_spec
from end2end.results.store import ResultRow, append_result

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the real check runs")
def test_without_a_gpu_the_script_exits_3_with_the_reason(tmp_path):
    run = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 3
    assert "no CUDA GPU is visible" in run.stderr and "configs/cpu.cfg" in run.stderr
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_attention_check_and_figure_run_on_cpu(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_attention_check.py"),
                    "--device", "cpu", "--seq", "64", "--heads", "2", "--dim", "16",
                    "--batch", "1", "--reps", "1", "--window", "16", "--out", str(tmp_path)],
                   check=True, capture_output=True, timeout=300)
    with open(tmp_path / "attention.tsv") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    by = {(r["case"], r["backend"]): r for r in rows}
    assert {"causal", "causal+window"} <= {c for c, _ in by}
    for case in ("causal", "causal+window"):
        assert by[(case, "eager")]["status"] == "ok" and by[(case, "math")]["status"] == "ok"
        assert float(by[(case, "math")]["max_err_out"]) < 0.05  # bf16 vs the eager reference
        assert by[(case, "efficient")]["status"] == "unsupported"
        assert "CUDA only" in by[(case, "efficient")]["note"]
    for mode, thrpt in (("eager", 10.0), ("slapo", 14.0)):  # the training part's results file
        spec = make_run_spec(mode, "tiny/gpt-neo", 1, 32, 0, 4, "0", steps=2, dtype="bf16")
        append_result(tmp_path / "gpu_check.tsv",
                      ResultRow.from_spec(spec, "ok", thrpt=thrpt, per_gpu_param=0.1,
                                          per_gpu_mem=0.1, per_gpu_tflops=0.01, mfu=0.1,
                                          step_time=0.4, time="t"))
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check_figure.py"),
                          str(tmp_path)], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    assert "gpt-neo" in out and "slapo" in out  # the printed bars
    assert any((tmp_path / f"gpu_check.{ext}").exists() for ext in ("png", "svg"))
