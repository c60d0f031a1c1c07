"""The simulator's memory model against real small CPU runs of the driver.

The simulated peak of live bytes on rank 0, through the ``cpu`` profile's calibrated relation
of the measurement to live bytes (:func:`end2end.simulate.calibration.cpu.memory_calibration`:
``fixed + (1 + overhead) x simulated``, from two real runs of ``slapo cpu/bert`` at seq 256,
another model and shape than the ones checked here), is within 25 % of the ``PerGPUMem`` the
driver measures (RSS high-water mark over its baseline) for ``eager`` and ``slapo`` on
``cpu/llama`` at seq 128 on 1 rank and ``slapo`` (TP) on 2 gloo ranks: the median error within
25 % (the issue's goal is 25 % on 80 % of rows) and none beyond 35 %. The errors of a run are
printed (``pytest -s``). Docs: docs/simulate.md, "Memory against a real run".
"""

from __future__ import annotations

import pytest

from end2end.simulate.calibration.cpu import measured_peak, memory_calibration
from end2end.simulate.engine.isolated import isolated

MODEL, SEQ, BATCH = "cpu/llama", 128, 8


@pytest.mark.timeout(900)
def test_simulated_peak_memory_is_close_to_a_real_cpu_run(tmp_path):
    calibration = memory_calibration()
    overhead, fixed = calibration["memory_overhead"], calibration["memory_fixed_bytes"]
    # RSS sees more than live tensors, not 3x more, and a process's fixed part is under 1 GB
    assert 0.0 <= overhead < 2.0 and 0.0 <= fixed < 1e9, calibration
    errors = {}
    for mode, n in (("eager", 1), ("slapo", 1), ("slapo", 2)):
        real = measured_peak(mode, MODEL, n, SEQ, BATCH, tmp_path / f"{mode}{n}.tsv")
        predicted = isolated("end2end.simulate.calibration.cpu.simulated_peak", mode, MODEL, n, SEQ,
                             BATCH) * (1 + overhead) + fixed
        errors[f"{mode} n={n}"] = predicted / real - 1
    print("predicted / measured - 1:", {k: f"{v:+.0%}" for k, v in errors.items()})
    ordered = sorted(abs(e) for e in errors.values())
    assert ordered[len(ordered) // 2] <= 0.25 and ordered[-1] <= 0.35, errors
