"""The append lock of results files (end2end/results/locked_file.py): filelock on the sidecar
``<results>.append.lock``. Processes appending at once leave every row whole and in one order
in the TSV and its twin, a sweep holding ``<results>.lock`` does not block its ranks' appends,
a torn last line is closed off, and a reader that cannot create the sidecar still reads."""

import json
import multiprocessing

import pytest

from end2end.results import locked_file
from end2end.results.store import ResultRow, append_result, read_results, twin_path
from end2end.spec.config_file import make_run_spec
from end2end.sweep.lock import SweepLock

ROWS = 80
ERROR = "x" * 400  # long rows: a write that is not atomic would interleave


def _append(path: str, worker: int, start) -> None:
    start.wait(30)
    spec = make_run_spec("eager", "tiny/bert", 1, 16, 0, worker + 1, "0")
    for i in range(ROWS):
        status = "fail" if i % 2 else "ok"
        row = ResultRow.from_spec(spec, status, thrpt=None if i % 2 else float(i),
                                  error=f"{worker}:{i} {ERROR}" if i % 2 else "")
        append_result(path, row, {"device": "cpu"})


def test_two_processes_appending_at_once_leave_every_row_whole(tmp_path):
    path = tmp_path / "r.tsv"
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no lock state inherited
    start = ctx.Event()
    procs = [ctx.Process(target=_append, args=(str(path), w, start)) for w in range(2)]
    with SweepLock(path):  # a sweep holds <results>.lock meanwhile: appends do not wait on it
        for p in procs:
            p.start()
        start.set()
        for p in procs:
            p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    res = read_results(path, strict=True)  # strict: any torn or interleaved line is an error
    assert len(res.rows) == 2 * ROWS and res.warnings == []
    for worker in range(2):
        mine = [r for r in res.rows if r.batch == worker + 1]
        assert [r.status for r in mine] == ["ok", "fail"] * (ROWS // 2)  # in order, whole
        assert all(r.error == f"{worker}:{i} {ERROR}" for i, r in enumerate(mine) if i % 2)
    twin = [json.loads(line) for line in twin_path(path).read_text().splitlines()]
    assert [t["Batch"] for t in twin if t["type"] == "row"] == [r.batch for r in res.rows]
    assert (tmp_path / "r.tsv.append.lock").exists()  # the sidecar, beside the sweep's lock
    assert locked_file.lock_path(path).name == "r.tsv.append.lock"


def test_a_torn_last_line_is_closed_off_before_the_next_row(tmp_path):
    path = tmp_path / "r.tsv"
    append_result(path, ResultRow.from_spec(make_run_spec("eager", "tiny/bert", 1, 16, 0, 1,
                                                          "0"), thrpt=1.0))
    with open(path, "a") as fh:
        fh.write("eager\ttiny/bert\t16")  # a writer killed mid-row
    append_result(path, ResultRow.from_spec(make_run_spec("eager", "tiny/bert", 1, 16, 0, 2,
                                                          "0"), thrpt=2.0))
    res = read_results(path, check_twin=False)
    assert [r.thrpt for r in res.rows] == [1.0, 2.0]
    assert len(res.warnings) == 1 and f"{path}:4: skipped malformed row" in res.warnings[0]


def test_a_reader_that_cannot_create_the_sidecar_reads_without_it(tmp_path, monkeypatch):
    path = tmp_path / "r.tsv"
    append_result(path, ResultRow.from_spec(make_run_spec("eager", "tiny/bert", 1, 16, 0, 1,
                                                          "0"), thrpt=1.0))

    class ReadOnly:
        def acquire(self):
            raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(locked_file, "append_lock", lambda path: ReadOnly())
    assert [r.thrpt for r in read_results(path).rows] == [1.0]


def test_reading_a_missing_file_creates_no_sidecar(tmp_path):
    from end2end.results.store import ResultsError

    with pytest.raises(ResultsError, match="cannot read results"):
        read_results(tmp_path / "typo.tsv")
    assert list(tmp_path.iterdir()) == []
