"""A calibration that knows when it is wrong (issue 35): the load check (load average, busy and
stolen CPU time from /proc/stat, the spread of repeated measurements), no implicit calibration
on a busy machine, a one-line warning for an explicit one, the load recorded in the file, every
prediction naming its calibration, and ``simulate.one`` validating the run first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slapo.errors import ConfigError

from end2end.simulate.calibration import load as load_mod
from end2end.simulate.cost.load_verdict import describe_load, spread, verdict

COMMITTED = Path(__file__).resolve().parents[3] / "docs" / "results" / "cpu_profile.json"
QUIET = dict(loadavg=0.1, cores=2, busy=0.02, steal=0.0)
BUSY = dict(loadavg=3.5, cores=2, busy=0.9, steal=0.0)


def test_busy_and_steal_come_from_two_proc_stat_samples(monkeypatch):
    # user nice system idle iowait irq softirq steal: 100 ticks pass, 30 busy, 10 stolen
    samples = iter([[0] * 8, [20, 0, 0, 60, 0, 0, 0, 10]])
    monkeypatch.setattr(load_mod, "_cpu_times", lambda stat="": next(samples))
    got = load_mod.machine_load(sample_s=0.0)
    assert got["busy"] == pytest.approx(0.3 / 0.9, abs=1e-3)
    assert got["steal"] == pytest.approx(10 / 90, abs=1e-3)
    assert got["cores"] >= 1 and got["loadavg"] >= 0


def test_the_verdict_names_what_is_wrong_in_one_line():
    assert verdict(QUIET) == ""
    line = verdict(dict(BUSY, steal=0.2, spread=0.4))
    assert "\n" not in line
    for word in ("90% of the CPU busy", "20% stolen", "load average 3.5 on 2 cores",
                 "40% apart"):
        assert word in line, line
    assert spread([10.0, 9.0, 5.0]) == pytest.approx(0.5) and spread([3.0]) == 0.0
    assert describe_load(None) == "load not recorded"
    assert describe_load(QUIET).endswith("(quiet)")


def _fake_measurement(load_before):
    data = json.loads(COMMITTED.read_text())
    data["load"] = dict(load_before, spread=0.01)
    return data


def test_no_implicit_calibration_on_a_busy_machine(tmp_path, monkeypatch):
    from end2end.simulate.calibration import cpu

    def measured():
        raise AssertionError("measured on a busy machine")

    monkeypatch.setattr(load_mod, "machine_load", lambda sample_s=0.5: dict(BUSY))
    monkeypatch.setattr(cpu, "measure_cpu", measured)
    with pytest.raises(ConfigError, match="this machine is busy") as err:
        cpu.device_profile("cpu", str(tmp_path / "cpu.json"))
    assert "\n" not in str(err.value) and "calibrate --out" in err.value.hint
    assert not (tmp_path / "cpu.json").exists()


def test_an_explicit_calibration_warns_and_records_the_load(tmp_path, monkeypatch, capsys):
    from end2end.simulate.calibration import cpu

    monkeypatch.setattr(load_mod, "machine_load", lambda sample_s=0.5: dict(BUSY))
    monkeypatch.setattr(cpu, "measure_cpu", lambda: _fake_measurement(BUSY))
    path = tmp_path / "cpu.json"
    profile = cpu.device_profile("cpu", str(path), recalibrate=True)
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1 and "busy machine" in warnings[0], warnings
    assert json.loads(path.read_text())["load"]["busy"] == 0.9
    assert "90% of the CPU busy" in profile.provenance and str(path) in profile.provenance
    # quiet: measured without a word, the file says so
    monkeypatch.setattr(load_mod, "machine_load", lambda sample_s=0.5: dict(QUIET))
    monkeypatch.setattr(cpu, "measure_cpu", lambda: _fake_measurement(QUIET))
    quiet = cpu.device_profile("cpu", str(tmp_path / "quiet.json"))
    assert not capsys.readouterr().err.strip()
    assert quiet.provenance.endswith("(quiet)")


def test_simulate_one_validates_the_run_before_the_profile_and_names_its_calibration(
        tmp_path, monkeypatch, capsys):
    from end2end.simulate import one
    from end2end.simulate.cost import profiles

    monkeypatch.setattr(profiles, "DEFAULT_CACHE", tmp_path / "missing.json")
    run = ["--mode", "slapo", "--model", "cpu/bert", "--gpus", "1", "--seq-len", "64",
           "--batch-size", "2", "--ckpt", "1.5", "--device", "cpu"]
    assert one.main(run) == 0  # no calibration exists: the invalid run is answered first
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["status"] == "fail" and "outside [0, 1]" in line["error"]
    assert profiles.get_profile("v100-32gb").provenance.startswith("v100-32gb: datasheet")
    committed = profiles.get_profile("cpu", str(COMMITTED))
    assert committed.provenance.startswith(f"cpu calibration {COMMITTED} measured ")
