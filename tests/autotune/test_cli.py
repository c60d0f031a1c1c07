"""``python -m slapo.autotune`` end to end on a synthetic command objective: progress lines, the
best candidate and its command line, a tuner killed mid-study (SIGKILL) and resumed without
re-running finished candidates, the objective's JSON via a result file, usage errors."""

import os
import subprocess
import sys
from pathlib import Path

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
