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


def _commands(module: str) -> list:
    """The arguments after ``-m MODULE`` of each command of gpu_check.sh running it (continued
    lines joined, the script's variables set)."""
    import re
    import shlex

    text = (ROOT / "scripts" / "gpu_check.sh").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        if f"-m {module}" not in line:
            continue
        words = shlex.split(line.replace('"$OUT', '"/out').replace('"$SIM_TIMEOUT"', "240"),
                            comments=True)
        for i, word in enumerate(words[:-1]):
            if word == "-m" and words[i + 1] == module:
                rest = words[i + 2:]
                cut = next((j for j, w in enumerate(rest) if re.fullmatch(r"[|>&)]+.*", w)),
                           len(rest))
                out.append(rest[:cut])
    return out


def test_the_h200_prediction_commands_parse_and_name_the_measured_config():
    """gpu_check.sh simulates its own config for h200 before the sweep and compares the two
    files after it (steps 1-3): the commands parse with the tools' own parsers, on the files
    the sweep writes."""
    from end2end.simulate.__main__ import build_parser as simulate_parser
    from end2end.simulate.compare import build_parser as compare_parser

    (sim,) = _commands("end2end.simulate")
    (sweep,) = _commands("end2end.sweep")
    (compare,) = _commands("end2end.simulate.compare")
    args = simulate_parser().parse_args(sim)
    assert args.config == sweep[0] == "end2end/configs/gpu_check.cfg"
    assert (ROOT / args.config).is_file()
    assert args.device == "h200" and args.results == "/out/gpu_check.h200.sim.tsv"
    assert args.timeout == 240
    from end2end.simulate.gpu_busy import build_parser as busy_parser

    (busy,) = _commands("end2end.simulate.gpu_busy")
    busy_args = busy_parser().parse_args(busy)
    assert (busy_args.measured, busy_args.simulated, busy_args.profiles) == (
        "/out/gpu_check.tsv", args.results,
        sweep[sweep.index("--profile") + 1])  # the profiles the sweep writes
    cmp_args = compare_parser().parse_args(compare)
    assert cmp_args.measured == sweep[sweep.index("--results") + 1] == "/out/gpu_check.tsv"
    assert cmp_args.simulated == args.results and cmp_args.profile == "h200"
    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    text = text[text.index("set -euo pipefail"):]  # the code, not the header's description
    # simulated before the measured sweep, bounded; the table after it
    assert text.index("timeout \"$SIM_TIMEOUT\"") < text.index('wait "$sim_pid"') \
        < text.index("-m end2end.sweep") < text.index("-m end2end.simulate.compare")
