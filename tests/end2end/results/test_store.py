"""Results files (end2end/results/store.py):
append, read, validate, resume after an interruption."""

import json

import pytest

from end2end.spec.config_file import RunSpec, expand, parse_lines
from end2end.results.store import (COLUMNS, ResultRow, ResultsError, append_result, pending_runs,
                             read_results, twin_path)

ENV = {"git_commit": "abc123", "torch": "2.13.0", "device": "cpu: test", "transformers": "5"}
CFG = ["#@ steps=3 warmup=1 dtype=fp32",
       "slapo cpu/bert 1,2 128 0 4 0",
       "deepspeed cpu/bert 2 128 0 4 1",
       "eager cpu/t5 1 64 32 2 0"]


def _runs():
    return expand(parse_lines(CFG, "r.cfg"))


def _ok(spec: RunSpec, thrpt: float) -> ResultRow:
    return ResultRow.from_spec(spec, "ok", thrpt=thrpt, per_gpu_param=17.3, per_gpu_mem=0.5,
                               per_gpu_tflops=0.01, mfu=0.3, step_time=0.5, time="t")


def test_columns_start_with_the_artifact_header():
    assert COLUMNS[:11] == tuple("Impl Model Seq DecSeq nGPU Batch Ckpt PerGPUParam Thrpt "
                                 "PerGPUMem PerGPUTFLOPS".split())
    assert {"Status", "MFU", "StepTime", "GitCommit", "Torch", "Transformers", "DeepSpeed",
            "MegatronCore", "Device", "World", "TP", "PP", "DP", "Time", "Error"} <= set(COLUMNS)


def test_append_and_read_roundtrip(tmp_path):
    path = tmp_path / "res.tsv"
    runs = _runs()
    append_result(path, _ok(runs[0], 12.5), ENV)
    fail = ResultRow.from_spec(runs[1], "fail", error="RuntimeError: boom\n\tat line 3")
    append_result(path, fail, ENV)
    text = path.read_text().splitlines()
    assert text[0].startswith("# slapo-results") and json.loads(text[1][6:]) == ENV
    assert text[2].split("\t") == list(COLUMNS)
    res = read_results(path)
    assert res.env == ENV and res.warnings == []
    ok, bad = res.rows
    assert (ok.thrpt, ok.status, ok.tp, ok.dp, ok.steps, ok.dtype) == (12.5, "ok", 1, 1, 3, "fp32")
    assert ok.key == runs[0].key
    assert (bad.status, bad.thrpt, bad.error) == ("fail", None, "RuntimeError: boom at line 3")
    twin = [json.loads(line) for line in twin_path(path).read_text().splitlines()]
    assert twin[0]["type"] == "env" and twin[1]["Thrpt"] == 12.5 and twin[2]["Status"] == "fail"


def test_rows_are_validated(tmp_path):
    spec = _runs()[0]
    with pytest.raises(ResultsError, match="status ok but no throughput"):
        append_result(tmp_path / "r.tsv", ResultRow.from_spec(spec, "ok"))
    with pytest.raises(ResultsError, match="no error message"):
        append_result(tmp_path / "r.tsv", ResultRow.from_spec(spec, "oom"))
    with pytest.raises(ResultsError, match="not one of"):
        append_result(tmp_path / "r.tsv", ResultRow.from_spec(spec, "crashed", error="x"))
    assert not (tmp_path / "r.tsv").exists()


def test_interrupted_sweep_resumes_without_repeats_or_losses(tmp_path):
    path = tmp_path / "sweep.tsv"
    runs = _runs()
    assert len(runs) == 4
    # first session: run 0 ok, run 1 failed, then killed while writing run 2 (torn line)
    append_result(path, _ok(runs[0], 10.0), ENV)
    append_result(path, ResultRow.from_spec(runs[1], "fail", error="segfault"), ENV)
    with open(path, "a") as fh:
        fh.write("slapo\tcpu/bert\t128\t0\t2\t4")  # torn, no newline
    res = read_results(path)
    assert len(res.rows) == 2 and any("malformed" in w for w in res.warnings)
    with pytest.raises(ResultsError, match=r"sweep.tsv:6: skipped malformed row"):
        read_results(path, strict=True)
    assert pending_runs(runs, path) == runs[2:]
    assert pending_runs(runs, path, retry_failed=True) == runs[1:]
    # second session resumes: only the pending runs are appended
    for spec in pending_runs(runs, path):
        append_result(path, _ok(spec, 20.0), ENV)
    res = read_results(path, check_twin=False)
    keys = [r.key for r in res.rows]
    assert sorted(keys) == sorted(r.key for r in runs) and len(keys) == len(set(keys))
    assert pending_runs(runs, path) == []
    assert [r.status for r in res.rows] == ["ok", "fail", "ok", "ok"]
    # retrying the failure appends a second row for it; the ok row then counts
    append_result(path, _ok(runs[1], 15.0), ENV)
    assert pending_runs(runs, path, retry_failed=True) == []


def test_twin_mismatch_is_reported(tmp_path):
    path = tmp_path / "r.tsv"
    runs = _runs()
    append_result(path, _ok(runs[0], 1.0), ENV)
    with open(twin_path(path), "a") as fh:
        fh.write(json.dumps({"type": "row", "Impl": "slapo", "Model": "cpu/bert", "Seq": 128,
                             "DecSeq": 0, "nGPU": 2, "Batch": 4, "Ckpt": "0"}) + "\n")
    assert any("do not match" in w for w in read_results(path).warnings)


def test_reads_the_artifact_format(tmp_path):
    path = tmp_path / "artifact.tsv"
    path.write_text(
        "GPU: Tesla V100-SXM2-32GB\nPyTorch 2.0.1\n\n"
        "Impl\tModel\tSeq\tDecSeq\tnGPU\tBatch\tCkpt\tPerGPUParam\tThrpt\tPerGPUMem\t"
        "PerGPUTFLOPS\n"
        "megatron\tbert-xlarge\t512\t0\t2\t20\t0\t437.3\t21.5\t28.1\t43.6\n"
        "deepspeed\tbert-xlarge\t512\t0\t8\t144\t0\tna\toom\toom\toom\n")
    ok, oom = read_results(path).rows
    assert (ok.status, ok.thrpt, ok.ngpu) == ("ok", 21.5, 2)
    assert (oom.status, oom.thrpt) == ("oom", None)


def test_incompatible_header_is_refused(tmp_path):
    path = tmp_path / "r.tsv"
    path.write_text("# slapo-results v1\nImpl\tModel\n")
    with pytest.raises(ResultsError, match="different columns"):
        append_result(path, _ok(_runs()[0], 1.0))


def test_a_pipelined_line_is_another_run_than_the_default_layout(tmp_path):
    """The layout is part of a run's identity: a ``#@ pp=2`` copy of a line is still pending
    after the default-layout run of the same line is done (and vice versa)."""
    path = tmp_path / "pp.tsv"
    default, piped = expand(parse_lines(["slapo cpu/bert 2 128 0 4 0",
                                         "#@ pp=2", "slapo cpu/bert 2 128 0 4 0"], "p.cfg"))
    assert default.key != piped.key and piped.key[7] == "tp1.pp2" and default.key[7] == ""
    append_result(path, _ok(default, 10.0), ENV)
    assert pending_runs([default, piped], path) == [piped]
    append_result(path, _ok(piped, 8.0), ENV)
    assert pending_runs([default, piped], path) == []
    assert [r.key for r in read_results(path).rows] == [default.key, piped.key]


def test_resumed_column_round_trips(tmp_path):
    path = tmp_path / "res.tsv"
    runs = _runs()
    append_result(path, _ok(runs[0], 1.0), ENV)
    row = _ok(runs[1], 2.0)
    row.resumed = "from step 10"
    append_result(path, row, ENV)
    header = path.read_text().splitlines()[2].split("\t")
    assert header[-1] == "Resumed" and "Resumed" in COLUMNS
    first, resumed = read_results(path).rows
    assert first.resumed == "" and resumed.resumed == "from step 10"
