"""``python -m end2end.simulate.host_cost``: the host's cost per op measured on host-bound GPU
runs, judged on others, from the committed H200 runs (docs/results/gpu_h200/more)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from end2end.simulate.cost.profiles import get_profile
from end2end.simulate.host_cost import format_host_cost, host_cost, main

ROOT = Path(__file__).resolve().parents[3]
MORE = ROOT / "docs" / "results" / "gpu_h200" / "more"


def _rows():
    rows = [json.loads(line) for line in (MORE / "gpu_more.jsonl").read_text().splitlines()]
    return [row for row in rows if row.get("type") == "row"]


def test_measured_host_cost_predicts_a_host_bound_run_the_profile_cannot():
    """Calibrated on the two small BERT runs, judged on the small OPT run: the GPU waits for the
    host there (93 % idle), so the step follows the host's cost per op; a published 10 us
    (HolisticTraceAnalysis's launch alone) predicts it more than twice too fast."""
    profile = dataclasses.replace(get_profile("h200"), host_op_s=10e-6)
    result = host_cost(_rows(), "cpu/bert", profile, only=["cpu/opt"])
    assert [c["label"].split()[1] for c in result["calibration"]] == ["cpu/bert", "cpu/bert"]
    for c in result["calibration"]:
        assert c["ops"] > 100 and 20e-6 < c["per_op"] < 100e-6, c  # tens of us per op
    per_op = [c["per_op"] for c in result["calibration"]]
    assert min(per_op) <= result["host_op_s"] <= max(per_op)
    (opt,) = result["judged"]
    assert opt["step"] / opt["profile_step"] > 2
    assert abs(opt["step"] / opt["measured_host_step"] - 1) < 0.25, opt
    text = format_host_cost(result, "h200")
    assert "host_op_s measured" in text and "not measurements" in text


def test_bad_input_is_refused_with_the_reason(tmp_path, capsys):
    profile = get_profile("h200")
    with pytest.raises(Exception, match="no ok row's label contains 'nothing'"):
        host_cost(_rows(), "nothing", profile)
    two = dict(_rows()[0], nGPU=2)
    with pytest.raises(Exception, match="several ranks"):
        host_cost([two], "cpu/", profile)
    assert main([str(tmp_path / "missing.tsv"), "--calibrate-on", "cpu/"]) == 1
    assert "JSON-lines twin" in capsys.readouterr().err


def test_a_measured_host_cost_replaces_every_gpu_profiles_and_is_said(monkeypatch):
    from end2end.simulate.cost.profiles import HOST_OP_ENV, MEASURED_HOST_OP_S, PROFILES

    monkeypatch.setenv(HOST_OP_ENV, "21.5")
    for name in PROFILES:
        profile = get_profile(name)
        assert profile.host_op_s == pytest.approx(21.5e-6), name
        assert f"host 21.5 us per op ({HOST_OP_ENV})" in profile.provenance
    assert PROFILES["h200"].host_op_s == pytest.approx(MEASURED_HOST_OP_S)  # table unchanged
    for bad in ("abc", "0", "-3", "inf", "nan"):
        monkeypatch.setenv(HOST_OP_ENV, bad)
        with pytest.raises(Exception, match="not a positive number of microseconds"):
            get_profile("h200")
    monkeypatch.setenv(HOST_OP_ENV, "")
    assert get_profile("h200") is PROFILES["h200"]


def test_every_gpu_profile_takes_the_committed_measurement_of_the_host_cost():
    """The profiles' ``host_op_s`` is the median that ``host_cost`` printed on the committed H200
    runs (docs/results/gpu_h200/host_cost.txt), and its source says so."""
    from end2end.simulate.cost.profiles import MEASURED_HOST_OP_S, PROFILES, SOURCES

    text = (ROOT / "docs" / "results" / "gpu_h200" / "host_cost.txt").read_text()
    measured = re.search(r"host_op_s measured: ([0-9.]+) us", text)
    assert measured, text[:400]
    assert MEASURED_HOST_OP_S == pytest.approx(float(measured.group(1)) * 1e-6)
    for name, profile in PROFILES.items():  # the GPU profiles (cpu's is its calibration)
        assert profile.host_op_s == MEASURED_HOST_OP_S, name
        assert "docs/results/gpu_h200/host_cost.txt" in SOURCES[name]["host_op_s"], name
