"""The benchmark driver (end2end/driver/bench.py):
one valid row per run for every mode, ``fail``/``oom``
rows for crashes and out-of-memory errors (injected with ``SLAPO_BENCH_FAULT``), a crash on a
non-zero rank under ``torchrun`` recorded by that rank with a non-zero exit, and resume.

Two spawns keep it short: all modes and the in-process faults in one 2-rank process group
(``run_bench`` is called once per run, as the sweep would launch it), and one real ``torchrun``
launch through the sweep (the CLI, cross-rank failure, resume).
"""

import math
import os

import pytest

from end2end.driver.bench import main as bench_main
from end2end.driver.bench import parse_args, run_bench
from end2end.driver.measure import FAULT_ENV, is_oom, maybe_inject_fault
from end2end.results.store import read_results
from end2end.sweep.single_node import run_sweep
from slapo.testing import run_distributed

MODES = ("megatron", "slapo-megatron", "deepspeed", "slapo-deepspeed", "eager", "slapo")
COMMON = ["--seq-len", "16", "--batch-size", "4", "--steps", "2", "--warmup", "1",
          "--gemm-seconds", "0.05", "--device", "cpu"]


def _runs(results: str):
    """On every rank: each mode on tiny GPT-Neo (CKPT as the mode takes it), T5 under Slapo-TP,
    then an injected OOM and crash on all ranks. Returns the exit codes."""
    ckpt = {"megatron": "full", "deepspeed": "1", "eager": "1"}
    codes = {}
    for mode in MODES:
        args = parse_args(["--mode", mode, "--model", "tiny/gpt-neo", "--ckpt",
                           ckpt.get(mode, "0.5"), "--results", results, *COMMON])
        codes[mode] = run_bench(args)
    codes["t5"] = run_bench(parse_args(["--mode", "slapo-megatron", "--model", "tiny/t5",
                                        "--dec-seq-len", "8", "--results", results, *COMMON]))
    for fault in ("oom", "crash"):
        os.environ[FAULT_ENV] = fault
        try:
            codes[fault] = run_bench(parse_args(["--mode", "slapo", "--model", "tiny/bert",
                                                 "--results", results, *COMMON]))
        finally:
            del os.environ[FAULT_ENV]
    return codes


def test_every_mode_writes_one_valid_row_and_faults_become_rows(tmp_path):
    results = tmp_path / "r.tsv"
    codes = run_distributed(_runs, 2, str(results), timeout=400)
    assert codes[0] == {**{m: 0 for m in MODES}, "t5": 0, "oom": 1, "crash": 1}
    res = read_results(results)
    assert not res.warnings and res.env["device"].startswith("cpu")
    rows = res.rows
    assert [r.impl for r in rows] == [*MODES, "slapo-megatron", "slapo", "slapo"]
    for row in rows[:7]:
        assert row.status == "ok" and row.error == "", row
        assert row.thrpt > 0 and row.step_time > 0 and row.per_gpu_param > 0
        assert row.per_gpu_mem > 0 and row.per_gpu_tflops > 0 and 0 < row.mfu < 10
        assert row.world == 2 and row.steps == 2 and row.dtype == "fp32" and row.torch
        assert math.isclose(row.thrpt, 4 / row.step_time, rel_tol=1e-4)  # 6 digits
    by_mode = {r.impl: r for r in rows[:6]}
    assert (by_mode["megatron"].tp, by_mode["megatron"].dp) == (2, 1)
    assert (by_mode["deepspeed"].tp, by_mode["deepspeed"].dp) == (1, 2)
    # TP shards and ZeRO-3 partitions hold fewer parameters per rank than the replicated model
    assert by_mode["slapo-megatron"].per_gpu_param < by_mode["eager"].per_gpu_param
    assert by_mode["deepspeed"].per_gpu_param < by_mode["eager"].per_gpu_param
    oom, crash = rows[7], rows[8]
    assert oom.status == "oom" and "OutOfMemoryError" in oom.error and oom.thrpt is None
    assert crash.status == "fail" and "injected crash" in crash.error and crash.mfu is None


def test_torchrun_crash_on_rank1_and_resume(tmp_path, monkeypatch):
    """The sweep launches the CLI under torchrun; rank 1 crashes, writes the row, exits 1."""
    cfg = tmp_path / "c.cfg"
    cfg.write_text("#@ steps=2 warmup=1\neager tiny/gpt2 2 16 0 4 0\n")
    results = tmp_path / "r.tsv"
    monkeypatch.setenv(FAULT_ENV, "crash@1")
    assert run_sweep(str(cfg), str(results), max_devices=2, timeout=300) == 1
    (row,) = read_results(results).rows
    assert row.status == "fail" and row.error.startswith("rank 1: RuntimeError: injected crash")
    log = next((tmp_path / "r.tsv.logs").iterdir()).read_text()
    assert "end2end.bench: fail: rank 1" in log
    # resume: the run has a row, nothing is launched again, no row is added; still not ok
    assert run_sweep(str(cfg), str(results), max_devices=2) == 1
    assert len(read_results(results).rows) == 1


def test_invalid_arguments_write_no_row(tmp_path, capsys):
    results = tmp_path / "r.tsv"
    code = bench_main(["--mode", "slapo", "--model", "tiny/bert", "--seq-len", "16",
                       "--batch-size", "4", "--ckpt", "half", "--results", str(results)])
    assert code == 2 and not results.exists()
    assert "CKPT 'half' is not valid" in capsys.readouterr().err


def test_fault_injection_and_oom_detection():
    import torch

    maybe_inject_fault(0, {})
    maybe_inject_fault(0, {FAULT_ENV: "oom@1"})  # another rank's fault
    with pytest.raises(torch.OutOfMemoryError):
        maybe_inject_fault(1, {FAULT_ENV: "oom@1"})
    with pytest.raises(ValueError, match="expected oom, crash or kill"):
        maybe_inject_fault(0, {FAULT_ENV: "segv"})
    assert is_oom(MemoryError()) and is_oom(RuntimeError("CUDA out of memory. Tried"))
    assert not is_oom(RuntimeError("shape mismatch"))


def _fp32_masters_run(results: str):
    args = parse_args(["--mode", "eager", "--model", "tiny/gpt2", "--ckpt", "0", "--dtype",
                       "bf16", "--fp32-masters", "--results", results, *COMMON])
    return run_bench(args)


def test_fp32_masters_reach_the_run_and_its_row(tmp_path):
    """``--fp32-masters``: the run trains under megatron-core's optimizer (imported before the
    memory baseline), and its row's JSON twin says so."""
    import json

    results = tmp_path / "m.tsv"
    assert run_distributed(_fp32_masters_run, 1, str(results), timeout=300) == [0]
    (row,) = read_results(results).rows
    assert row.status == "ok" and row.dtype == "bf16", row
    lines = [json.loads(t) for t in (tmp_path / "m.jsonl").read_text().splitlines()]
    (twin,) = [line for line in lines if "extra" in line]  # after the environment's line
    assert twin["extra"]["fp32_masters"] is True
