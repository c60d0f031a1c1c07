"""The ``commands`` block (issue 38): the README's commands table is derived from the runs' own
records (the results rows' time stamps, machine, commit; a sitting log's wall time), and only what
no record holds is typed, marked ``†``."""

from pathlib import Path

import pytest

from end2end.report.__main__ import ROOT, update
from end2end.report.blocks import ReportError
from end2end.report.commands_table import COLUMNS, commands_markdown, read_source
from end2end.results.store import ResultRow, append_result

ENV = {"time": "2026-12-01T10:00:00+00:00", "cpu_model": "Test CPU 9000", "cpu_affinity": 2}
HEAD = "\t".join(COLUMNS)


def _results(tmp_path: Path, machine=("", "")) -> Path:
    path = tmp_path / "docs" / "results" / "r.tsv"
    for i, (impl, cell) in enumerate(zip(("eager", "slapo"), machine)):
        append_result(path, ResultRow(impl, "tiny/llama", 16, 0, 1, 2, "0", thrpt=1.0 + i,
                                      git_commit=["abc1234def00", "abc1234def00-dirty"][i],
                                      time=f"2026-12-01T10:0{3 * i}:30+00:00", machine=cell,
                                      extra={"loadavg_start": [1.5 + 2 * i, 0, 0]}), env=ENV)
    return path


def _source(tmp_path: Path, *lines: str) -> Path:
    src = tmp_path / "docs" / "results" / "commands.src.tsv"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("# typed by hand\n" + HEAD + "\n" + "\n".join(lines) + "\n")
    return src


def test_cells_come_from_the_rows_and_the_log_and_typed_ones_are_marked(tmp_path):
    _results(tmp_path)
    (tmp_path / "docs" / "results" / "sitting.log").write_text(
        "2026-12-01T09:59:50Z start job load 0.1 0.2 0.3\n"
        "2026-12-01T10:04:07Z end job rc=0 257 s load 1.0 1.0 1.0\n")
    src = _source(tmp_path,
                  "`run r`\tthe sweep\tdocs/results/r.tsv\t\t\t\t\t",
                  "`run r`\twith its log\tdocs/results/r.tsv\tdocs/results/sitting.log#job\t\t\t\t",
                  "`setup`\tthe set-up\t\t\t1 min 13 s\t2026-12-01 08:00\tidle VM\tfff0000")
    table = commands_markdown(tmp_path, src).splitlines()
    # span of the header time and the rows, the last row's time, machine and commits from rows
    assert table[2] == ("| `run r` | the sweep | 3 min 30 s (first to last row) | 2026-12-01 "
                        "10:03 | Test CPU 9000, 2 cores; not watched (1-min load at run start: "
                        "median 2.5, max 3.5) | abc1234, abc1234-dirty |")
    assert table[3].startswith("| `run r` | with its log | 4 min 17 s | 2026-12-01 10:04 |")
    assert table[4] == ("| `setup` | the set-up | 1 min 13 s † | 2026-12-01 08:00 † | "
                        "idle VM † | fff0000 † |")
    assert "typed in `docs/results/commands.src.tsv`" in table[-1]


def test_a_reproduce_step_record_gives_the_wall_time(tmp_path):
    _results(tmp_path)
    state = tmp_path / "docs" / "results" / ".reproduce"
    state.mkdir(parents=True)
    (state / "fig7.json").write_text('{"name": "fig7", "status": "ok", "seconds": 754.0, '
                                     '"finished": "2026-12-01 10:05 UTC", "commands": []}')
    (state / "bad.json").write_text('{"name": "bad"}')
    src = _source(tmp_path, "`run r`\tthe sweep\tdocs/results/r.tsv\t"
                            "docs/results/.reproduce/fig7.json\t\t\t\t")
    assert "| 12 min 34 s | 2026-12-01 10:05 |" in commands_markdown(tmp_path, src)
    src = _source(tmp_path, "`run r`\tthe sweep\tdocs/results/r.tsv\t"
                            "docs/results/.reproduce/bad.json\t\t\t\t")
    with pytest.raises(ReportError, match="bad.json is not a step record"):
        commands_markdown(tmp_path, src)


def test_a_pattern_of_step_records_sums_the_plan(tmp_path):
    _results(tmp_path)
    state = tmp_path / "docs" / "results" / "full" / ".reproduce"
    state.mkdir(parents=True)
    for name, seconds, end in (("a", 600.0, "10:05"), ("b", 154.0, "10:09")):
        (state / f"{name}.json").write_text(
            f'{{"name": "{name}", "status": "ok", "seconds": {seconds}, '
            f'"finished": "2026-12-01 {end} UTC", "commands": []}}')
    src = _source(tmp_path, "`full`\tthe plan\tdocs/results/r.tsv\t"
                            "docs/results/full/.reproduce/*.json\t\t\t\t")
    assert "| 12 min 34 s | 2026-12-01 10:09 |" in commands_markdown(tmp_path, src)
    src = _source(tmp_path, "`full`\tthe plan\tdocs/results/r.tsv\t"
                            "docs/results/none/.reproduce/*.json\t\t\t\t")
    with pytest.raises(ReportError, match="no step record matches"):
        commands_markdown(tmp_path, src)


def test_the_machine_cell_counts_the_rows_measured_while_busy(tmp_path):
    _results(tmp_path, machine=("quiet (others 1%)", "busy (others 60%)"))
    src = _source(tmp_path, "`run r`\tthe sweep\tdocs/results/r.tsv\t\t\t\t\t")
    assert "Test CPU 9000, 2 cores; busy in 1 of 2 runs |" in commands_markdown(tmp_path, src)
    _results(tmp_path.joinpath("q"), machine=("quiet (x)", "quiet (y)"))
    src = _source(tmp_path / "q", "`run r`\tthe sweep\tdocs/results/r.tsv\t\t\t\t\t")
    assert "quiet in all 2 runs" in commands_markdown(tmp_path / "q", src)


@pytest.mark.parametrize("line, message", [
    ("`x`\tno source\t\t\t\t\t\t", "has no measured: no results file or record"),
    ("`x`\tbad record\t\tdocs/results/none.log#job\t\t\t\t", "expected LOG#STEP"),
    ("`x`\tbad file\tdocs/results/none.tsv\t\t\t\t\t", "none.tsv does not exist"),
])
def test_a_line_without_records_is_one_clear_error(tmp_path, line, message):
    with pytest.raises(ReportError, match=message):
        commands_markdown(tmp_path, _source(tmp_path, line))


def test_a_wrong_header_is_refused(tmp_path):
    src = tmp_path / "c.tsv"
    src.write_text("command\twhat\tmeasured\n")
    with pytest.raises(ReportError, match="the header line must be"):
        read_source(src)


def test_the_readme_table_is_generated_from_the_committed_source():
    source = read_source(ROOT / "docs" / "results" / "commands.src.tsv")
    assert len(source) >= 10 and all(line["results"] or line["measured"] for line in source)
    assert not (ROOT / "docs" / "results" / "commands.tsv").exists()  # no hand-typed table
    assert update([ROOT / "README.md"], check=True) == 0
