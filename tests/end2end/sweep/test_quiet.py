"""The quiet-machine guard (issue 38 item 2): every row says whether the machine was quiet while
its run was measured, the tables mark what was measured while it was busy, and
``--require-quiet`` refuses a busy machine in one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from end2end.results.annotate import annotate_since
from end2end.results.store import ResultRow, append_result, mark, read_results, twin_path
from end2end.results.summary import BUSY_NOTE, figure7_table, format_markdown, speedups
from end2end.sweep.quiet import MachineBusy, Snapshot, judge, wait_until_quiet

ROOT = Path(__file__).resolve().parents[3]


def _snap(wall, busy, ours=0.0, steal=0.0, procs=None, cores=2, load=1.0):
    return Snapshot(wall, busy, steal, total=wall * cores, load=load, ours=ours,
                    procs=procs or {}, cores=cores)


def test_the_verdict_separates_our_own_work_from_others():
    # 10 s on 2 cores: our run used 19 of the 20 core-seconds, others 1 -> quiet
    quiet = judge(_snap(0, 0), _snap(10, 20, ours=19))
    assert not quiet.busy and quiet.cell().startswith("quiet (others 5% of 2 cores")
    # others used 8 core-seconds -> busy
    assert judge(_snap(0, 0), _snap(10, 18, ours=10)).busy
    # the hypervisor stole 20% of the time -> busy
    assert judge(_snap(0, 0), _snap(10, 10, ours=10, steal=4)).busy
    # one other process used most of a core (present before and after) -> busy, and named
    verdict = judge(_snap(0, 0, procs={(4242, 7): ("hog", 1.0)}),
                    _snap(10, 10, ours=10, procs={(4242, 7): ("hog", 10.0),
                                                  (17, 3): ("idle", 0.1)}))
    assert verdict.busy and "1 busy process (4242 hog 90%)" in verdict.reasons()
    assert verdict.record()["busy_processes"] == [{"pid": 4242, "name": "hog", "share": 0.9}]


def test_require_quiet_waits_then_refuses_in_one_line():
    busy = judge(_snap(0, 0), _snap(10, 18, ours=0))
    quiet = judge(_snap(0, 0), _snap(10, 0))
    answers, clock, slept = [busy, busy, quiet], iter(range(0, 100, 10)), []
    assert not wait_until_quiet(60, print, check=lambda: answers.pop(0), sleep=slept.append,
                                clock=lambda: next(clock)).busy
    assert slept == [10.0, 10.0]
    with pytest.raises(MachineBusy, match=r"the machine is busy \(others 90% of 2 cores"):
        wait_until_quiet(0, print, check=lambda: busy, sleep=slept.append)


def _row(impl, n, thrpt, repeat=0):
    return ResultRow(impl, "tiny/bert", 64, 0, n, 4, "0", thrpt=thrpt, repeat=repeat)


def test_annotation_fills_the_rows_of_one_run_and_the_tables_mark_them(tmp_path):
    results = tmp_path / "r.tsv"
    append_result(results, _row("megatron", 2, 5.0), {"host": "x"})
    start = mark(results)
    append_result(results, _row("slapo-megatron", 2, 6.0))
    assert annotate_since(results, start, "Machine", "busy (others 50% of 2 cores)",
                          "machine", {"busy": True}) == 1
    rows = read_results(results, strict=True).rows
    assert [r.machine for r in rows] == ["", "busy (others 50% of 2 cores)"]
    last = twin_path(results).read_text().splitlines()[-1]
    assert '"Machine": "busy (others 50% of 2 cores)"' in last and '"busy": true' in last
    table = figure7_table(rows)
    text = format_markdown(table, speedups(table))
    assert "6 ! |" in text and "1.20x !" in text and "5 |" in text  # the bar and its ratio
    assert BUSY_NOTE.startswith("`!`")


def test_a_file_from_before_the_column_stays_readable_and_keeps_its_columns(tmp_path):
    old = tmp_path / "old.tsv"
    header = "\t".join(read_columns := ["Impl", "Model", "Seq", "DecSeq", "nGPU", "Batch", "Ckpt",
                                        "PerGPUParam", "Thrpt", "PerGPUMem", "PerGPUTFLOPS"])
    old.write_text(f"{header}\neager\ttiny/bert\t64\t0\t1\t4\t0\t1\t3.5\t0.1\t0.01\n")
    start = mark(old)
    append_result(old, _row("slapo", 1, 4.0))
    assert annotate_since(old, start, "Machine", "busy (x)", "machine", {"busy": True}) == 0
    assert old.read_text().splitlines()[0].split("\t") == read_columns
    assert [r.thrpt for r in read_results(old).rows] == [3.5, 4.0]
    assert '"busy": true' in twin_path(old).read_text()


def test_a_sweep_beside_a_busy_process_flags_its_rows_and_require_quiet_refuses(tmp_path, hog):
    cfg = tmp_path / "one.cfg"
    cfg.write_text("#@ steps=1 warmup=1\neager tiny/bert 1 16 0 2 0\n")
    results = tmp_path / "r.tsv"
    sweep = [sys.executable, "-m", "end2end.sweep", str(cfg), "--results", str(results)]
    run = subprocess.run(sweep, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    (row,) = read_results(results, strict=True).rows
    assert row.machine.startswith("busy (") and "busy process" in row.machine, row.machine
    # the cell names the three busiest; the twin has every busy process, the hog among them
    record = json.loads(twin_path(results).read_text().splitlines()[-1])
    assert hog.pid in [p["pid"] for p in record["extra"]["machine"]["busy_processes"]], record
    assert "measured while the machine was busy" in run.stdout + run.stderr

    refused = tmp_path / "refused.tsv"
    run = subprocess.run([*sweep[:-1], str(refused), "--require-quiet", "--quiet-wait", "0"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    errors = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2 and len(errors) == 1, run.stderr
    assert errors[0].startswith("end2end.sweep: error: the machine is busy (") \
        and "busy process" in errors[0] and "--quiet-wait" in errors[0], errors[0]
    assert not refused.exists()
