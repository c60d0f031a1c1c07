"""``simulate_runs``: a config's runs simulated ``jobs`` at a time, yielded in the config's
order; leaving the loop cancels the runs not yet started. The worker process is replaced by a
function of this test (what is tested is the scheduling around it, not a simulation)."""

import threading
import time

import pytest

from end2end.simulate.engine import run as run_module


class FakeWorker:
    """Stands in for ``simulate_run``: sleeps ``delays[spec]`` seconds, counts runs in flight."""

    def __init__(self, delays):
        self.delays, self.lock = delays, threading.Lock()
        self.in_flight = self.most = 0
        self.started = []

    def __call__(self, spec, profile_name, calibration="", timeout=900):
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.started.append(spec)
        time.sleep(self.delays[spec])
        with self.lock:
            self.in_flight -= 1
        return {"status": "sim", "spec": spec}


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_rows_come_in_the_configs_order_with_jobs_at_a_time(monkeypatch, jobs):
    delays = {"a": 0.3, "b": 0.05, "c": 0.2, "d": 0.01, "e": 0.1}
    worker = FakeWorker(delays)
    monkeypatch.setattr(run_module, "simulate_run", worker)
    began = time.perf_counter()
    out = list(run_module.simulate_runs(list(delays), "v100-32gb", jobs=jobs))
    wall = time.perf_counter() - began
    assert [spec for spec, _, _ in out] == list(delays)
    assert [values["spec"] for _, values, _ in out] == list(delays)
    assert worker.most == min(jobs, len(delays))
    for spec, _, seconds in out:  # each run's own time, not the time it waited to be yielded
        assert delays[spec] <= seconds < delays[spec] + 0.25
    if jobs == 1:
        assert wall >= sum(delays.values())


def test_leaving_the_loop_cancels_the_runs_not_started(monkeypatch):
    # b outlasts the loop: once a is done only one slot frees (c), whatever the machine's load
    # (with b as short as a, b could finish and start d before the caller's close)
    delays = dict(dict.fromkeys("abcdef", 0.1), b=3.0)
    worker = FakeWorker(delays)
    monkeypatch.setattr(run_module, "simulate_run", worker)
    runs = run_module.simulate_runs(list(delays), "v100-32gb", jobs=2)
    assert next(runs)[0] == "a"
    runs.close()  # what an exception or Ctrl-C in the caller's loop does
    assert len(worker.started) <= 3, worker.started  # a, b and at most the one started next


def test_a_workers_environment_takes_the_runs_variables(monkeypatch):
    """``simulate_run(..., environ=...)``: each worker gets the variables of its own run (set, or
    unset with ``None``), not whatever the parent process holds: what lets ``validate`` simulate
    points launched with different allocator configurations at the same time. The worker
    process is replaced by a function of this test that records its environment."""
    import subprocess

    seen = {}

    def fake_run(cmd, **kwargs):
        seen.update(kwargs["env"])
        return subprocess.CompletedProcess(cmd, 0, stdout='{"status": "sim"}\n', stderr="")

    class Spec:
        def to_json(self):
            return "{}"

    monkeypatch.setattr(run_module.subprocess, "run", fake_run)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "from-the-parent")
    values = run_module.simulate_run(Spec(), "v100-32gb", environ={
        "PYTORCH_CUDA_ALLOC_CONF": None, "SLAPO_TEST_VARIABLE": "1"})
    assert values == {"status": "sim"}
    assert "PYTORCH_CUDA_ALLOC_CONF" not in seen and seen["SLAPO_TEST_VARIABLE"] == "1"
    seen.clear()
    run_module.simulate_run(Spec(), "v100-32gb",
                            environ={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert seen["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
