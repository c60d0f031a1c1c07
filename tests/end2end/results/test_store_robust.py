"""Results files under concurrent writers and with damaged lines (issue 19, rows 4 and 13).

Rows are appended by several processes at once (the ranks of one job, or a sweep and a manual
driver run): the TSV and its JSON twin must receive them in one order, with no false
"interrupted?" warning. A damaged line (a byte that is not UTF-8, a broken ``# env`` header)
costs that line only: resume and plot skip it with a ``file:line`` warning.
"""

import json
import multiprocessing

from end2end.spec.config_file import expand, parse_lines
from end2end.results.plot import main as plot_main
from end2end.results.store import ResultRow, append_result, pending_runs, read_results, twin_path

LINES = [f"eager tiny/bert 1 16 0 {b} 0" for b in range(1, 9)]


def _writer(path: str, worker: int, count: int) -> None:
    (spec,) = expand(parse_lines([f"eager tiny/bert 1 16 0 {worker + 1} 0"]))
    for i in range(count):
        append_result(path, ResultRow.from_spec(spec, "ok", thrpt=float(i)), {"device": "cpu"})


def test_concurrent_appends_keep_both_files_in_one_order(tmp_path):
    path = tmp_path / "r.tsv"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 60)) for w in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    res = read_results(path)
    assert len(res.rows) == 360
    assert res.warnings == []  # no false "rows do not match ... interrupted?"


def _results_with_damage(tmp_path):
    path = tmp_path / "r.tsv"
    specs = expand(parse_lines(LINES[:3], "c.cfg"))
    for i, spec in enumerate(specs):
        append_result(path, ResultRow.from_spec(spec, "ok", thrpt=1.0 + i, device="cpu"),
                      {"device": "cpu"})
    lines = path.read_bytes().split(b"\n")
    env_line = next(i for i, ln in enumerate(lines) if ln.startswith(b"# env "))
    lines[env_line] = b'# env {"device": "cpu", "torch": '  # broken JSON
    lines[-2] = lines[-2].replace(b"eager", b"eag\xffer")  # last row: one bad byte
    path.write_bytes(b"\n".join(lines))
    twin = twin_path(path)
    twin.write_bytes(twin.read_bytes() + b'{"type": "row", "Impl": "\xfe\n')
    return path, specs, env_line + 1, len(lines) - 1


def test_damaged_lines_are_skipped_with_file_line_in_resume(tmp_path):
    path, specs, env_lineno, bad_lineno = _results_with_damage(tmp_path)
    res = read_results(path)
    assert len(res.rows) == 2 and res.env == {}
    text = "\n".join(res.warnings)
    assert f"{path}:{env_lineno}: skipped damaged '# env' line" in text
    assert f"{path}:{bad_lineno}: skipped a line that is not UTF-8 (byte 0xff" in text
    assert f"{twin_path(path)}:5: skipped a line that is not UTF-8" in text
    # resume: the damaged row's run is pending again, the others are done
    assert pending_runs(specs, path) == [specs[2]]


def test_damaged_lines_are_skipped_with_file_line_in_plot(tmp_path, capsys):
    path, _, env_lineno, bad_lineno = _results_with_damage(tmp_path)
    assert plot_main([str(path), "-o", str(tmp_path / "fig"), "--best"]) == 0
    err = capsys.readouterr().err
    assert f"{path}:{env_lineno}:" in err and f"{path}:{bad_lineno}:" in err
    assert (tmp_path / "fig.png").exists()


def test_a_bom_at_the_start_of_a_results_file_is_ignored(tmp_path):
    path = tmp_path / "r.tsv"
    (spec,) = expand(parse_lines(LINES[:1]))
    append_result(path, ResultRow.from_spec(spec, "ok", thrpt=2.0), {"device": "cpu"})
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    res = read_results(path)
    assert len(res.rows) == 1 and res.env == {"device": "cpu"} and not res.warnings
    assert json.loads(twin_path(path).read_text().splitlines()[0])["type"] == "env"
