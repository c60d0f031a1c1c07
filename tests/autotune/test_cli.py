"""``python -m slapo.autotune`` end to end on a synthetic command objective: progress lines, the
best candidate and its command line, a tuner killed mid-study (SIGKILL) and resumed without
re-running finished candidates, the objective's JSON via a result file, usage errors, and every
mistake in a space file (or a --db that is no study database) as one line ``file:line: what.
Hint: ...`` on stderr with exit status 2, never a traceback."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slapo.autotune import load_records

from . import synthetic

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "synthetic.py")


def _space_file(tmp_path) -> str:
    path = tmp_path / "space.py"
    path.write_text("import sys\n"
                    f"sys.path.insert(0, {str(HERE)!r})\n"
                    "from synthetic import space as _space\n"
                    "space = _space()\n")
    return str(path)


def _tune(tmp_path, *args, command=()):
    cmd = [sys.executable, "-m", "slapo.autotune", "--space", _space_file(tmp_path), *args]
    if command:
        cmd += ["--", *command]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          start_new_session=True)


def _evaluations(log: Path):
    return [tuple(line.split()) for line in log.read_text().splitlines()]


def test_cli_kill_resume_and_best(tmp_path):
    db, log = str(tmp_path / "s.db"), tmp_path / "calls.txt"
    objective = [sys.executable, SCRIPT, "--batch", "{batch_size}", "--ratio", "{ckpt_ratio}",
                 "--log", str(log)]
    killed = _tune(tmp_path, "--strategy", "search", "--budget", "30", "--db", db,
                   command=[*objective, "--kill-parent-at", "5"])
    assert killed.returncode == -9, killed.stderr
    assert killed.stdout.count("\n[") + killed.stdout.startswith("[") == 4  # 4 progress lines
    assert "[4/30] batch_size=32 ckpt_ratio=0.6: oom (synthetic OOM)" in killed.stdout
    first = _evaluations(log)
    assert len(first) == 5  # the fifth was running when the tuner died
    resumed = _tune(tmp_path, "--strategy", "search", "--budget", "30", "--db", db,
                    command=objective)
    assert resumed.returncode == 0, resumed.stderr
    calls = _evaluations(log)[5:]
    assert calls[0] == first[4] and not set(calls) & set(first[:4])
    best_t, best_c = synthetic.optimum()
    assert f"best: batch_size={best_c['batch_size']} ckpt_ratio={best_c['ckpt_ratio']:g} -> " \
           f"{best_t:.4g}" in resumed.stdout
    assert f"reproduce: {sys.executable} {SCRIPT} --batch 16 --ratio 0 --log" in resumed.stdout
    assert "config line: synthetic 16 0" in resumed.stdout
    assert "| best 80 (batch_size=16 ckpt_ratio=0) | ETA <=" in resumed.stdout
    records = load_records(db, "search")
    assert [r.status for r in records].count("interrupted") == 1
    assert sum(r.evaluated for r in records) == len(first) - 1 + len(calls)
    listed = _tune(tmp_path, "--strategy", "search", "--db", db, "--list")
    assert listed.returncode == 0 and "interrupted" in listed.stdout


def test_cli_result_file_timeout_failures_and_usage_errors(tmp_path):
    db = str(tmp_path / "s.db")
    objective = [sys.executable, SCRIPT, "--batch", "{batch_size}", "--ratio", "{ckpt_ratio}",
                 "--result-file", "{result_file}"]
    grid = _tune(tmp_path, "--strategy", "grid", "--budget", "3", "--db", db, "--study", "g",
                 command=objective)
    assert grid.returncode == 0, grid.stderr
    assert [r.status for r in load_records(db, "g")] == ["ok"] * 3
    crash = _tune(tmp_path, "--strategy", "grid", "--budget", "1", command=[
        sys.executable, "-c", "import sys; print('partial output'); sys.exit(3)"])
    assert crash.returncode == 1 and "fail (exit status 3, no JSON result line" in crash.stdout
    assert "no candidate ran ok" in crash.stdout
    slow = _tune(tmp_path, "--strategy", "grid", "--budget", "1", "--timeout", "0.5",
                 command=[sys.executable, "-c", "import time; time.sleep(30)"])
    assert slow.returncode == 1 and "timeout (no result after 0.5 s" in slow.stdout
    typo = _tune(tmp_path, "--strategy", "grid", command=["echo", "{batch}"])
    assert typo.returncode == 2 and "placeholder(s) {batch} in the command name no symbol" \
        in typo.stderr and "known: batch_size, ckpt_ratio" in typo.stderr
    missing = subprocess.run([sys.executable, "-m", "slapo.autotune", "--space",
                              str(tmp_path / "nope.py"), "--", "true"], capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode == 2 and "space file" in missing.stderr
    assert not os.path.exists(tmp_path / "nope.py")


SPACE_HEAD = "from slapo.autotune import Space\n"
BAD_SPACES = {
    "syntax": (SPACE_HEAD + "space = Space(\nspace.int('b', 1, 4)\n",
               r"{f}:2: syntax error: '\(' was never closed\. Hint: fix that line "
               r"\(python -m py_compile {f} reports the same\)\."),
    "raises": ("import json\nx = 1\nspace = json.loads('{')\n",
               r"{f}:3: running the space file raised JSONDecodeError: .*\. Hint: fix the file "
               r"\(python {f} shows the traceback\)\."),
    "declaration": (SPACE_HEAD + "space = Space()\nspace.int('b', 4, 1)\n",
                    r"{f}:3: Space 'space': symbol 'b' low 4 is greater than high 1\. "
                    r"Hint: swap them\."),
    "make_space": (SPACE_HEAD + "def make_space():\n    s = Space()\n    return s.nope()\n",
                   r"{f}:4: running the space file raised AttributeError: 'Space' object has "
                   r"no attribute 'nope'\. Hint: .*"),
    "make_space returns no Space": (SPACE_HEAD + "def make_space():\n    return 3\n",
                                    r"{f}:2: make_space\(\) returned an int, not a "
                                    r"slapo.autotune.Space\. Hint: .*"),
    "no space": ("x = 1\n",
                 r"{f}: defines no `space` \(a slapo.autotune.Space\) or `make_space\(\)`\. "
                 r"Hint: add e\.g\. .*"),
    "not a Space": ("x = 1\nspace = [1, 2]\n",
                    r"{f}:2: `space` is a list, not a slapo.autotune.Space\. Hint: .*"),
    "bad timeout": (SPACE_HEAD + "space = Space()\nspace.int('b', 1, 4)\ntimeout = 'abc'\n",
                    r"{f}:4: `timeout` is 'abc', not a positive number of seconds\. Hint: .*"),
    "bad command": (SPACE_HEAD + "space = Space()\nspace.int('b', 1, 4)\ncommand = 3\n",
                    r"{f}:4: `command` is an int, not a string or a list of strings\. Hint: .*"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPACES))
def test_a_space_file_mistake_is_one_line_with_its_line_and_a_hint(tmp_path, capsys, case):
    from slapo.autotune.cli import main

    source, pattern = BAD_SPACES[case]
    space = tmp_path / "space.py"
    space.write_text(source)
    assert main(["--space", str(space), "--", "echo", "{b}"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err and err.count("\n") == 1, err
    f = re.escape(str(space))
    assert re.fullmatch(r"slapo\.autotune: error: " + pattern.format(f=f) + "\n", err), err


def test_the_command_line_exits_2_without_a_traceback(tmp_path):
    space = tmp_path / "space.py"
    space.write_text(SPACE_HEAD + "space = Space(\n")
    proc = subprocess.run([sys.executable, "-m", "slapo.autotune", "--space", str(space), "--",
                           "true"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == f"slapo.autotune: error: {space}:2: syntax error: '(' was never " \
                          f"closed. Hint: fix that line (python -m py_compile {space} reports " \
                          "the same).\n"


def test_a_study_database_that_is_not_one_is_one_line(tmp_path, capsys):
    from slapo.autotune.cli import main

    db = tmp_path / "s.db"
    db.write_text("not a database\n")
    assert main(["--space", _space_file(tmp_path), "--db", str(db), "--list"]) == 2
    err = capsys.readouterr().err
    assert err == f"slapo.autotune: error: {db}: cannot open it as a study database (file is " \
                  "not a database). Hint: give the .db file an earlier tune wrote, or a new " \
                  "file name.\n"
