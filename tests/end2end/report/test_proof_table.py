"""The report block ``proof MEASURED SIMULATED`` (``end2end/report/proof_table.py``): the per-run
table, the statistics against the goals, the pairs' directions and both files' provenance, from
committed files only."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from end2end.report.__main__ import update
from end2end.report.blocks import Block, ReportError
from end2end.report.generators import render
from end2end.results.store import ResultRow, append_result

ENV = {"time": "2026-12-02T03:00:00+00:00", "cpu_model": "Test CPU 9000", "cpu_affinity": 2,
       "git_commit": "abc1234", "torch": "2.13.0+cpu"}
# (mode, model, measured samples/s per round, measured GB, predicted samples/s, predicted GB)
RUNS = [("eager", "tiny/bert", (2.0, 2.2), 1.0, 2.0, 1.1),
        ("slapo", "tiny/bert", (4.0, 4.4), 0.8, 3.0, 0.9),    # 2.0x measured, 1.5x predicted
        ("eager", "tiny/gpt2", (5.0, 5.0), 2.0, 4.0, 1.0),
        ("slapo", "tiny/gpt2", (6.0, 6.0), 2.0, 3.0, 1.2)]    # 1.2x measured, 0.75x: wrong way


def _row(mode, model, **values) -> ResultRow:
    return ResultRow(impl=mode, model=model, seq=32, dec_seq=0, ngpu=1, batch=4, ckpt="0",
                     git_commit="abc1234", **values)


def _files(tmp_path: Path):
    measured = tmp_path / "docs" / "results" / "m.tsv"
    simulated = tmp_path / "docs" / "results" / "proof" / "simulated.tsv"
    for mode, model, rounds, mem, thrpt, sim_mem in RUNS:
        for repeat, value in enumerate(rounds):
            append_result(measured, _row(mode, model, thrpt=value, per_gpu_mem=mem,
                                         device="cpu", repeat=repeat,
                                         time=f"2026-12-02T03:0{repeat}:00"), env=ENV)
        append_result(simulated, _row(mode, model, thrpt=thrpt, per_gpu_mem=sim_mem,
                                      status="sim", device="cpu (simulated)",
                                      time="2026-12-02T04:20:00"),
                      env=dict(ENV, profile="this machine, measured 2026-12-02 04:05"))
    simulated.with_suffix(".cmd").write_text("python -m end2end.simulate.proof c.cfg "
                                             "--measured docs/results/m.tsv\n"
                                             "# run on the lead's  machine\n")
    return measured, simulated


def test_the_proof_block_tables_statistics_pairs_and_provenance(tmp_path):
    _files(tmp_path)
    doc = tmp_path / "README.md"
    doc.write_text(textwrap.dedent("""\
        <!-- report: proof docs/results/m.tsv docs/results/proof/simulated.tsv -->
        <!-- /report -->
        """))
    assert update([doc], root=tmp_path) == 0
    text = doc.read_text()
    assert ("Measured 2026-12-02 03:00-03:01 UTC on Test CPU 9000 (2 cores), commit abc1234; "
            "8 rows in [`docs/results/m.tsv`]") in text
    assert ("Simulated 2026-12-02 04:20-04:20 UTC on Test CPU 9000 (2 cores) with the profile "
            "'this machine, measured 2026-12-02 04:05'") in text
    assert "made by `python -m end2end.simulate.proof c.cfg --measured docs/results/m.tsv`" \
        in text
    # a comment line the shell would not split (its apostrophe) is kept as written
    assert "then `# run on the lead's machine`" in text
    # eager tiny/bert: measured median 2.1 samples/s (rounds 2-2.2), predicted 2.0: -5 %;
    # memory +10 %
    assert ("| eager tiny/bert n=1 s=32 b=4 ckpt=0 | 1.000 | 1.100 | +10% | 2.1 (2-2.2) | 2 | "
            "-5% |") in text
    # against the fastest rounds: |2/2.2-1|, |3/4.4-1|, |4/5-1|, |3/6-1| -> 28 %
    assert "Against each run's fastest round" in text and "samples/s MAPE 28%" in text
    assert "within 25 %: 50% of runs (goal >= 80 %: **not met**)" in text
    # bias = predicted / measured ratio - 1: 1.5 / 2 - 1 and 0.75 / 1.2 - 1
    assert "| slapo / eager | tiny/bert | 1 | 2.00x | 1.50x | -25% | yes |" in text
    assert "| slapo / eager | tiny/gpt2 | 1 | 1.20x | 0.75x | -38% | **no** |" in text
    assert "1 of 2 predicted the same way (goal: all: **not met**)" in text
    assert "over all 2 pairs: median -31" in text and "0 of 2 above 0" in text
    assert "(goal within +-5 %: **not met**)" in text
    assert update([doc], root=tmp_path, check=True) == 0


@pytest.mark.parametrize("args, message", [
    (("docs/results/m.tsv",), "needs a measured and a simulated results file"),
    (("docs/results/m.tsv", "docs/results/none.tsv"), "none.tsv does not exist"),
    (("docs/results/proof/simulated.tsv", "docs/results/m.tsv"), "has both a measured ok row"),
])
def test_wrong_arguments_are_clear_errors(tmp_path, args, message):
    _files(tmp_path)
    block = Block(Path("README.md"), 3, "proof", args, "", (2, 3))
    with pytest.raises(ReportError, match=message) as err:
        render(tmp_path, block)
    assert "README.md:3" in str(err.value)
