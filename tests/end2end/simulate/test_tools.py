"""The simulator's tools: the CPU proof (measure and simulate the same lines, compare) on a
4-line tiny config, and ``run_all_single_node.sh CONFIG --check``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TINY = """#@ steps=2 warmup=1 dtype=fp32
eager tiny/bert 1 32 0 4 0
slapo tiny/bert 1 32 0 4 0
eager tiny/gpt2 1 32 0 4 0
slapo tiny/gpt2 1 32 0 4 0
"""


def _calibration_data() -> dict:
    """A cpu profile in the cache's format (the proof's plumbing is tested, not the machine)."""
    from end2end.simulate.cost.profiles import FORMAT
    from end2end.simulate.cost.cpu_model import EagerCpuModel

    eager = EagerCpuModel.constant(2, flops=1e11, bandwidth=1e10, op_seconds=1e-5)
    return dict(flops=dict(float32=1e11, bfloat16=1e11, float16=1e11), memory_bandwidth=1e10,
                bandwidth=1e9, alpha_s=1e-4, threads=2, cores=2, measured="test",
                memory_overhead=0.5, eager=eager.to_json(), format=FORMAT)


def _calibration(path: Path) -> str:
    path.write_text(json.dumps(_calibration_data()))
    return str(path)


@pytest.mark.timeout(900)
def test_proof_measures_simulates_and_compares_a_tiny_config(tmp_path):
    from end2end.simulate.proof import main

    config = tmp_path / "tiny.cfg"
    config.write_text(TINY)
    out = tmp_path / "proof"
    assert main([str(config), "--out", str(out), "--repeat", "1",
                 "--calibration", _calibration(tmp_path / "cpu.json")]) == 0
    text = (out / "proof.md").read_text()
    rows = [ln for ln in text.splitlines() if " s=32 b=4 " in ln]
    assert len(rows) == 4, text
    assert "Spearman" in text and "MAPE" in text
    pairs = [ln for ln in text.splitlines() if ln.startswith("| slapo / eager")]
    assert len(pairs) == 2, text  # one Slapo/baseline pair per model
    from end2end.simulate.proof import compare, summarise

    both = compare(out / "measured.tsv", out / "simulated.tsv")
    assert len(both) == 4 and (both["mem_measured"] > 0).all()
    summary = summarise(both)
    assert all(math.isfinite(v) for v in summary.values()), summary
    # the simulated memory is the live bytes x (1 + the calibration's 0.5)
    sim = [json.loads(ln) for ln in (out / "simulated.jsonl").read_text().splitlines()
           if '"type": "row"' in ln]
    for row in sim:
        peak = max(m["peak"] for m in row["extra"]["memory"])
        assert row["PerGPUMem"] == pytest.approx(peak * 1.5 / 1e9, rel=1e-6)


@pytest.mark.timeout(900)
def test_proof_calibrates_first_then_measures_and_simulates(tmp_path, monkeypatch):
    """``--calibrate``: the profile is measured first, into DIR/cpu_profile.json, before the
    sweep runs, and the simulation reads that file (the measurement itself is replaced by a
    stand-in that notes when it ran: the plumbing is tested, not the machine)."""
    import time

    from end2end.simulate.calibration import cpu as calibration
    from end2end.simulate.proof import main

    calls = []

    def measure():
        calls.append(time.time())
        return dict(_calibration_data(), memory_overhead=0.25)

    monkeypatch.setattr(calibration, "measure_cpu", measure)
    config = tmp_path / "tiny.cfg"
    config.write_text("\n".join(TINY.splitlines()[:3]) + "\n")  # the two bert lines
    out = tmp_path / "proof"
    assert main([str(config), "--out", str(out), "--repeat", "1", "--calibrate"]) == 0
    profile = out / "cpu_profile.json"
    assert len(calls) == 1 and json.loads(profile.read_text())["memory_overhead"] == 0.25
    assert profile.stat().st_mtime <= (out / "measured.tsv").stat().st_mtime
    assert calls[0] <= (out / "measured.tsv").stat().st_mtime
    sim = [json.loads(ln) for ln in (out / "simulated.jsonl").read_text().splitlines()
           if '"type": "row"' in ln]
    assert len(sim) == 2
    for row in sim:  # the simulation used the calibration measured first (overhead 0.25)
        peak = max(m["peak"] for m in row["extra"]["memory"])
        assert row["PerGPUMem"] == pytest.approx(peak * 1.25 / 1e9, rel=1e-6)
    assert "| slapo / eager | tiny/bert | 1 |" in (out / "proof.md").read_text()


@pytest.mark.timeout(900)
def test_explain_profiles_a_real_step_beside_the_prediction(tmp_path, capsys):
    """``end2end.simulate.explain`` on a tiny line: the real step under the profiler and the
    simulator's step, op group by op group (the groups' measured seconds add up to the step)."""
    from end2end.simulate.explain import main

    config = tmp_path / "tiny.cfg"
    config.write_text(TINY)
    out = tmp_path / "explain"
    assert main([str(config), "--only", "eager", "--only", "tiny/bert", "--out", str(out),
                 "--calibration", _calibration(tmp_path / "cpu.json")]) == 0
    text = (out / "explain.md").read_text()
    assert text.startswith("## eager tiny/bert") and text.count("## ") == 1, text
    rows = {ln.split("|")[1].strip(): ln.split("|")[2:-1] for ln in text.splitlines()
            if ln.startswith("| ") and not ln.startswith("| group") and "---" not in ln}
    for group in ("gemm", "elementwise", "views", "outside ATen"):
        assert group in rows, text
    assert float(rows["gemm"][0]) > 0 and float(rows["gemm"][3]) > 0  # measured, predicted
    step = float(text.split("measured step ")[1].split(" s")[0])
    groups = [ln for ln in text.split("\n\n")[2].splitlines()[2:]]
    measured = sum(float(ln.split("|")[2]) for ln in groups)
    assert measured == pytest.approx(step, rel=1e-3, abs=1e-3)  # outside ATen closes the sum
    assert "| aten::" in text  # the top ops by measured time
    capsys.readouterr()
    assert main([str(config), "--only", "nothing-matches", "--out", str(out)]) == 2
    assert "--only" in capsys.readouterr().err


def _measured_rows(path: Path) -> None:
    """Measured rows of TINY's runs as the sweep writes them (two rounds; no measuring here)."""
    from end2end.results.store import ResultRow, append_result

    for repeat in (0, 1):
        for line in TINY.splitlines()[1:]:
            mode, model, n, seq, dec, batch, ckpt = line.split()
            append_result(path, ResultRow(impl=mode, model=model, seq=int(seq), dec_seq=int(dec),
                                          ngpu=int(n), batch=int(batch), ckpt=ckpt,
                                          thrpt=(20.0 if mode == "slapo" else 10.0) + repeat,
                                          per_gpu_mem=0.2, device="cpu", repeat=repeat),
                          env={"cpu_model": "Test CPU"})


@pytest.mark.timeout(900)
def test_proof_with_measured_rows_only_simulates(tmp_path, capsys):
    """``--measured FILE``: nothing is measured; the simulated rows, their command and the
    report are written, and compared with FILE's rows (medians over its rounds)."""
    from end2end.simulate.proof import main

    config, measured = tmp_path / "tiny.cfg", tmp_path / "measured.tsv"
    config.write_text(TINY)
    _measured_rows(measured)
    out = tmp_path / "proof"
    argv = [str(config), "--out", str(out), "--measured", str(measured), "--only", "bert",
            "--calibration", _calibration(tmp_path / "cpu.json")]
    assert main(argv) == 0
    assert not (out / "measured.tsv").exists()  # nothing measured
    assert (out / "simulated.cmd").read_text().strip() == \
        "python -m end2end.simulate.proof " + " ".join(argv)
    text = (out / "proof.md").read_text()
    rows = [ln for ln in text.splitlines() if " s=32 b=4 " in ln]
    assert len(rows) == 2 and all("| 0.200 |" in r for r in rows), text  # bert only
    assert "| eager tiny/bert n=1 s=32 b=4 ckpt=0 | 0.200 |" in text  # median 10.5 samples/s
    assert "| 10.5 (10-11) |" in rows[0] and "| 20.5 (20-21) |" in rows[1], rows
    assert "| slapo / eager | tiny/bert | 1 | 1.95x |" in text
    # a missing measured file: one clear line, exit status 2
    capsys.readouterr()
    assert main([str(config), "--out", str(out), "--measured", str(tmp_path / "none.tsv")]) == 2
    assert "--measured" in capsys.readouterr().err


def _check(config: Path, results: Path, *args: str):
    env = dict(os.environ, SKIP_SETUP="1", PYTHON=sys.executable, SIM_RESULTS=str(results))
    return subprocess.run(["bash", str(ROOT / "end2end" / "run_all_single_node.sh"),
                           str(config), "--check", *args], capture_output=True, text=True,
                          env=env, timeout=600, cwd=ROOT)


@pytest.mark.timeout(900)
def test_check_lists_the_lines_predicted_to_fail(tmp_path):
    good = "eager tiny/bert 2 32 0 4 0\n"
    config = tmp_path / "tiny.cfg"
    config.write_text("# a tiny config for 8x V100\n" + good + "#@ pp=2\n" + good)
    proc = _check(config, tmp_path / "bad.sim.tsv")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "simulated for v100-32gb" in proc.stdout  # the device its comment names
    failed = [ln for ln in proc.stdout.splitlines() if ln.startswith("fail")]
    assert len(failed) == 1 and "eager tiny/bert n=2" in failed[0], proc.stdout
    config.write_text(good)
    proc = _check(config, tmp_path / "good.sim.tsv", "--sim-device", "h200")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every run is predicted to fit on h200" in proc.stdout
