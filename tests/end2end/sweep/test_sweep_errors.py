"""Numbers checked at the edge and errors a person can act on (issue 19, rows 3 and 5-10).

Bad numbers stop at the command line (exit 2, nothing runs, no row); config mistakes are one
line naming ``file:line`` with a hint (a traceback only with ``--debug``); an empty config says
so and nothing is plotted; a rank killed by a signal gets a row that names the signal.
"""

import os
import subprocess
from pathlib import Path

import pytest

from end2end.driver.bench import main as bench_main
from end2end.spec.config_file import ConfigLineError, parse_config, parse_lines
from end2end.driver.measure import FAULT_ENV
from end2end.results.store import read_results
from end2end.sweep.single_node import main as sweep_main
from end2end.sweep.single_node import run_sweep
from slapo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
BENCH = ["--mode", "eager", "--model", "tiny/bert", "--seq-len", "16", "--batch-size", "2"]


@pytest.mark.parametrize("bad", [["--steps", "-1"], ["--steps", "0"], ["--warmup", "-1"],
                                 ["--gemm-seconds", "0"], ["--steps", "x"]])
def test_bench_refuses_bad_numbers_before_running(tmp_path, capsys, bad):
    results = tmp_path / "r.tsv"
    with pytest.raises(SystemExit) as exit_info:
        bench_main([*BENCH, "--results", str(results), *bad])
    assert exit_info.value.code == 2 and not results.exists()
    assert f"argument {bad[0]}" in capsys.readouterr().err


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "inf"])
def test_sweep_refuses_a_timeout_that_is_not_a_positive_number(tmp_path, capsys, timeout):
    cfg = tmp_path / "c.cfg"
    cfg.write_text("eager tiny/bert 1 16 0 2 0\n")
    with pytest.raises(SystemExit) as exit_info:
        sweep_main([str(cfg), "--results", str(tmp_path / "r.tsv"), "--timeout", timeout])
    assert exit_info.value.code == 2 and "argument --timeout" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="timeout"):
        run_sweep(str(cfg), str(tmp_path / "r.tsv"), timeout=float(timeout))
    assert not (tmp_path / "r.tsv").exists()


def test_a_batch_expression_that_is_not_a_real_number_names_file_and_line():
    with pytest.raises(ConfigLineError, match=r"^c\.cfg:2: BATCH_SIZE expression "
                       r"'\(-8\)\*\*0\.5': a value is .*j\), not a real number"):
        parse_lines(["# a comment", 'eager tiny/bert 1 16 0 "(-8)**0.5" 0'], "c.cfg")


def test_a_bom_is_stripped_and_a_non_utf8_config_is_named(tmp_path):
    cfg = tmp_path / "bom.cfg"
    cfg.write_bytes(b"\xef\xbb\xbfeager tiny/bert 1 16 0 2 0\n")
    (line,) = parse_config(cfg)
    assert line.mode == "eager"
    latin = tmp_path / "latin1.cfg"
    latin.write_bytes(b"eager tiny/bert 1 16 0 2 0\n# caf\xe9\n")
    with pytest.raises(ConfigLineError, match=rf"^{latin}:2: the file is not UTF-8 \(byte 0xe9"):
        parse_config(latin)


def test_config_errors_are_one_line_and_a_traceback_only_with_debug(tmp_path, capsys):
    cfg = tmp_path / "c.cfg"
    cfg.write_text("eager tiny/bert 1 16 0 2 half\n")
    argv = [str(cfg), "--results", str(tmp_path / "r.tsv")]
    assert sweep_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{cfg}:1: CKPT 'half' is not valid" in err
    assert "Hint:" in err and "Traceback" not in err
    with pytest.raises(ConfigLineError):
        sweep_main([*argv, "--debug"])


def test_an_empty_config_says_so_and_nothing_is_plotted(tmp_path):
    cfg = tmp_path / "empty.cfg"
    cfg.write_text("# only a comment\n\n#@ steps=2\n")
    results = tmp_path / "out" / "empty.tsv"
    env = dict(os.environ, SKIP_SETUP="1", PYTHON=str(ROOT / ".venv" / "bin" / "python"),
               RESULTS=str(results), DEVICE="cpu")
    proc = subprocess.run(["bash", str(ROOT / "end2end" / "run_all_single_node.sh"), str(cfg)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{cfg}: no runs (the file is empty or has only comments)" in proc.stderr
    assert "Traceback" not in proc.stderr and "no plot" in proc.stderr
    assert not list(results.parent.glob("*fig7*"))


def test_a_rank_killed_by_a_signal_gets_a_row_naming_it(tmp_path, monkeypatch):
    cfg = tmp_path / "c.cfg"
    cfg.write_text("#@ steps=2 warmup=1\neager tiny/gpt2 2 16 0 4 0\n")
    results = tmp_path / "r.tsv"
    monkeypatch.setenv(FAULT_ENV, "kill@1")
    assert run_sweep(str(cfg), str(results), max_devices=2, timeout=300) == 1
    (row,) = read_results(results).rows
    assert row.status == "fail" and row.error.startswith("rank 1 killed by SIGKILL"), row.error
    assert "error_file" not in row.error


@pytest.mark.parametrize("text, expected", [
    (None, "cannot read hostfile '{h}': No such file or directory. Hint: give a file of "
           "'host slots=N' lines (--hostfile)."),
    ("node0 slots=8\nnode1 slots=x\n",
     "{h}:2: 'slots=x' is not 'slots=N' (N >= 1). Hint: write each line as 'HOST slots=GPUS', "
     "e.g. 'node0 slots=8'."),
    ("# no hosts\n\n", "{h}: no hosts (the file is empty or has only comments). Hint: write "
                       "one 'HOST slots=GPUS' line per node."),
], ids=["missing", "bad slots", "empty"])
def test_hostfile_mistakes_are_one_line(tmp_path, capsys, text, expected):
    from end2end.sweep.multi_node import main as multi_node_main

    hostfile = tmp_path / "hosts"
    if text is not None:
        hostfile.write_text(text)
    assert multi_node_main(["--hostfile", str(hostfile), "--dry-run",
                            "--results", str(tmp_path / "f8.tsv")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err == f"end2end.multi_node.launch: error: {expected.format(h=hostfile)}\n"


def test_a_hostfile_with_comments_and_slots_names_its_hosts(tmp_path):
    from end2end.sweep.multi_node import read_hostfile

    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the nodes\nnode0 slots=8  # first\n\nnode1\n")
    assert read_hostfile(str(hostfile)) == ["node0", "node1"]
