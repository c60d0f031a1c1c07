"""``python -m end2end.report`` (issue 26): generated blocks come from committed results only;
``--check`` passes on the repository and fails, naming the block, when a results file or a
generated block is edited by hand; malformed blocks are one-line errors with file:line."""

import textwrap
from pathlib import Path

import pytest

from end2end.report.__main__ import ROOT, documents, main, update
from end2end.report.blocks import ReportError, find_blocks
from end2end.results.store import ResultRow, append_result, read_results

ENV = {"time": "2026-12-01T10:00:00+00:00", "cpu_model": "Test CPU 9000", "cpu_affinity": 2,
       "git_commit": "abc1234", "torch": "2.13.0+cpu", "transformers": "5.24.0"}


def _results(tmp_path: Path) -> Path:
    """A two-system, two-round results file as the sweep writes it, and its command."""
    path = tmp_path / "docs" / "results" / "r.tsv"
    for repeat, (eager, slapo) in enumerate([(1.0, 2.0), (1.2, 2.1)]):
        for impl, thrpt in (("eager", eager), ("slapo", slapo)):
            append_result(path, ResultRow(impl=impl, model="tiny/llama", seq=16, dec_seq=0,
                                          ngpu=1, batch=2, ckpt="0", thrpt=thrpt,
                                          git_commit="abc1234", device="cpu", repeat=repeat,
                                          time=f"2026-12-01T10:0{repeat}:00"), env=ENV)
    path.with_suffix(".cmd").write_text("python -m end2end.sweep c.cfg --repeat 2\n")
    return path


def _doc(tmp_path: Path, body: str) -> Path:
    doc = tmp_path / "README.md"
    doc.write_text(textwrap.dedent(body))
    return doc


DOC = """\
    # Results
    <!-- report: results docs/results/r.tsv -->
    <!-- /report -->
    <!-- report: provenance docs/results/r.tsv -->
    stale text
    <!-- /report -->
    """


def test_blocks_are_written_then_checked_and_a_hand_edit_of_either_side_fails(tmp_path, capsys):
    res, doc = _results(tmp_path), _doc(tmp_path, DOC)
    assert update([doc], root=tmp_path, check=True) == 1  # not generated yet
    assert update([doc], root=tmp_path) == 0
    text = doc.read_text()
    assert "| `tiny/llama` (16, 2), 1 |" in text and "2.05 (2-2.1)" in text  # medians, ranges
    assert "1.88x (1.75-2.00)" in text  # the median of the per-round ratios, with their range
    assert "median (min-max) over 2 interleaved round(s)" in text  # the statistic, named
    assert ("Measured 2026-12-01 10:00-10:01 UTC on Test CPU 9000 (2 cores), commit abc1234; "
            "torch 2.13.0+cpu, transformers 5.24.0; 4 rows") in text
    assert "`python -m end2end.sweep c.cfg --repeat 2`" in text and "stale text" not in text
    assert update([doc], root=tmp_path, check=True) == 0
    # a number of the results edited by hand: the block no longer matches
    res.write_text(res.read_text().replace("\t2.1\t", "\t2.5\t"))
    res.with_name("r.jsonl").unlink()  # (the twin would disagree, warned, not an error)
    assert read_results(res).rows[-1].thrpt == 2.5
    capsys.readouterr()
    assert update([doc], root=tmp_path, check=True) == 1
    err = capsys.readouterr().err
    assert "README.md:2: the generated block 'results docs/results/r.tsv' differs" in err
    update([doc], root=tmp_path)
    # the block edited by hand
    doc.write_text(doc.read_text().replace("2.25 (2-2.5)", "2.30 (2-2.5)"))
    assert update([doc], root=tmp_path, check=True) == 1


@pytest.mark.parametrize("body, message", [
    ("<!-- report: modes -->\n", "README.md:1: the report block is never closed"),
    ("<!-- /report -->\n", "README.md:1: <!-- /report --> without an opening marker"),
    ("<!-- report: modes -->\n<!-- report: modes -->\n<!-- /report -->\n",
     "README.md:2: a report block opened inside the one of line 1"),
    ("<!-- report: nosuch -->\n<!-- /report -->\n", "README.md:1: unknown report block kind"),
    ("x\n<!-- report: results docs/results/missing.tsv -->\n<!-- /report -->\n",
     "README.md:2: results file docs/results/missing.tsv does not exist"),
    ("<!-- report: provenance docs/results/r.tsv -->\n<!-- /report -->\n",
     "README.md:1: r.tsv has no r.cmd beside it"),
])
def test_malformed_blocks_and_missing_sources_are_one_line_errors(tmp_path, capsys, body,
                                                                  message, monkeypatch):
    _results(tmp_path).with_suffix(".cmd").unlink()
    doc = _doc(tmp_path, body)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("end2end.report.__main__.ROOT", tmp_path)
    monkeypatch.setattr("end2end.report.__main__.update",
                        lambda paths, check: update(paths, root=tmp_path, check=check))
    assert main([str(doc), "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_markers_inside_code_fences_are_text():
    text = "```\n<!-- report: modes -->\n```\n"
    assert find_blocks(Path("x.md"), text) == []
    with pytest.raises(ReportError, match="never closed"):
        find_blocks(Path("x.md"), "<!-- report: modes -->\n```\n<!-- /report -->\n```\n")


def test_the_repository_docs_are_up_to_date():
    """Every generated block of README.md, docs/*.md and the experiment READMEs equals what its
    committed source gives (run ``python -m end2end.report`` after a new measurement)."""
    assert any(p.name == "README.md" and p.parent == ROOT for p in documents())
    assert main(["--check"]) == 0


def test_the_best_block_compares_each_sides_best_bar(tmp_path):
    """The paper's conclusion: the best Slapo bar against the best baseline bar per workload."""
    res = _results(tmp_path)
    for repeat, thrpt in enumerate([1.5, 1.6]):  # a faster baseline than eager
        append_result(res, ResultRow(impl="fsdp", model="tiny/llama", seq=16, dec_seq=0, ngpu=1,
                                     batch=2, ckpt="0", thrpt=thrpt, git_commit="abc1234",
                                     device="cpu", repeat=repeat))
    doc = _doc(tmp_path, "<!-- report: best docs/results/r.tsv -->\n<!-- /report -->\n")
    update([doc], root=tmp_path)
    row = [line for line in doc.read_text().splitlines() if line.startswith("| `tiny")]
    assert row == ["| `tiny/llama` (16), 1 | Slapo 2.05 | FSDP2 1.55 | 1.32x (1.31-1.33) |"], row


def test_a_tsv_block_counts_statuses_and_escapes_pipes(tmp_path):
    path = tmp_path / "docs" / "results" / "sweep.tsv"
    path.parent.mkdir(parents=True)
    path.write_text("family\tstatus\treason\nllama\tok\t\nbeam\trefused\ta | b\n")
    doc = _doc(tmp_path, "<!-- report: tsv docs/results/sweep.tsv -->\n<!-- /report -->\n")
    update([doc], root=tmp_path)
    text = doc.read_text()
    assert "ok: 1, refused: 1 (of 2)" in text and "| beam | refused | a \\| b |" in text
    # comment lines are skipped; --columns picks and orders the columns shown
    path.write_text("# made by x\nfamily\tstatus\treason\nllama\tok\tfine\n")
    doc.write_text("<!-- report: tsv docs/results/sweep.tsv --columns=reason,family -->\n"
                   "<!-- /report -->\n")
    update([doc], root=tmp_path)
    text = doc.read_text()
    assert "| reason | family |\n|---|---|\n| fine | llama |" in text and "made by" not in text
    doc.write_text("<!-- report: tsv docs/results/sweep.tsv --columns=nope -->\n<!-- /report -->\n")
    with pytest.raises(ReportError, match="no column"):
        update([doc], root=tmp_path)
