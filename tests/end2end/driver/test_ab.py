"""end2end.ab: two modes built in one 2-rank job, steps alternated and timed one by one; rank 0
reports both medians and the B/A ratio; profiles of one step each; bad arguments exit 2."""

import re

import pytest

from end2end.driver.ab import build_parser, run
from slapo.testing import run_distributed


def _ab(argv):
    return run(build_parser().parse_args(argv))


def test_two_modes_alternate_in_one_job(tmp_path):
    argv = ["eager", "slapo", "--model", "tiny/bert", "--seq-len", "16", "--batch-size", "4",
            "--steps", "3", "--warmup", "1", "--knob-b", "fuse=False",
            "--profile", str(tmp_path)]
    report, other = run_distributed(_ab, 2, argv)
    assert other is None  # rank 0 reports
    lines = report.splitlines()
    assert lines[0].startswith("tiny/bert, 2 rank(s), 3 alternating steps each")
    assert re.match(r"  eager +\d+\.\d{4} s \(\d+\.\d{4}-\d+\.\d{4}\)$", lines[1])
    assert re.match(r"  slapo \[fuse=False\] +\d+\.\d{4} s", lines[2])
    assert re.match(r"  speed slapo \[fuse=False\] / eager: \d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d, "
                    r"3 repeats\)", lines[3])
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "ab-eager.rank0.json" in names and "ab-eager.rank1.json" in names
    assert any(n.startswith("ab-slapo") and n.endswith(".rank1.json") for n in names)


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as err:
        build_parser().parse_args(["eager", "nonsense", "--model", "tiny/bert",
                                   "--seq-len", "16", "--batch-size", "4"])
    assert err.value.code == 2
    assert "invalid choice: 'nonsense'" in capsys.readouterr().err
