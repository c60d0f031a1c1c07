"""``python -m slapo.autotune`` with a ``predict`` command in the space file: pruned candidates
are progress lines, counted in the summary and listed by ``--list``; a re-run predicts and runs
nothing again; every mistake in the prediction set-up is one line on stderr, exit status 2."""

import subprocess
import sys
from pathlib import Path

from slapo.autotune import load_records

from . import synthetic

HERE = Path(__file__).resolve().parent
OBJECTIVE = [sys.executable, str(HERE / "synthetic.py"), "--batch", "{batch_size}", "--ratio",
             "{ckpt_ratio}"]
PREDICT = [sys.executable, str(HERE / "synthetic_predict.py"), "--batch", "{batch_size}",
           "--ratio", "{ckpt_ratio}"]


def _space_file(tmp_path, extra: str) -> str:
    path = tmp_path / "space.py"
    path.write_text("import sys\n"
                    f"sys.path.insert(0, {str(HERE)!r})\n"
                    "from synthetic import space as _space\n"
                    "space = _space()\n" + extra)
    return str(path)


def _tune(space: str, *args):
    return subprocess.run([sys.executable, "-m", "slapo.autotune", "--space", space, *args],
                          capture_output=True, text=True, timeout=240, start_new_session=True)


def test_pruned_candidates_are_reported_listed_and_not_predicted_again(tmp_path):
    runs, predicted = tmp_path / "runs.txt", tmp_path / "predicted.txt"
    space = _space_file(tmp_path, f"command = {OBJECTIVE + ['--log', str(runs)]!r}\n"
                        f"predict = {PREDICT + ['--log', str(predicted)]!r}\n"
                        f"memory_budget_gb = {synthetic.LIMIT}\n")
    db, cache = str(tmp_path / "s.db"), str(tmp_path / "p.jsonl")
    args = ["--strategy", "grid", "--db", db, "--prune-predicted-oom", "0.1", "--predictions",
            cache]
    first = _tune(space, *args)
    assert first.returncode == 0, first.stderr
    points = [(c["batch_size"], c["ckpt_ratio"]) for c in synthetic.space().candidates()]
    over = [p for p in points if synthetic.memory(*p) > synthetic.LIMIT * 1.1]
    assert f"; {len(over)} pruned by prediction, not run" in first.stdout
    assert "batch_size=32 ckpt_ratio=0: pruned (predicted 96 GB per rank > budget 48 GB" \
        in first.stdout
    assert len(runs.read_text().splitlines()) == len(points) - len(over)
    assert len(predicted.read_text().splitlines()) == len(points)
    assert len(Path(cache).read_text().splitlines()) == len(points)
    listed = _tune(space, "--strategy", "grid", "--db", db, "--list")
    statuses = [line.split()[1] for line in listed.stdout.splitlines()]
    assert listed.returncode == 0 and statuses.count("pruned") == len(over)
    again = _tune(space, *args)
    assert again.returncode == 0, again.stderr
    assert len(runs.read_text().splitlines()) == len(points) - len(over)  # nothing run again
    assert len(predicted.read_text().splitlines()) == len(points)  # nor predicted
    assert sum(r.status == "pruned" for r in load_records(db, "grid")) == len(over)
    ranked = _tune(space, "--strategy", "grid", "--db", db, "--study", "ranked", "--budget",
                   "2", "--rank-by-prediction", "--predictions", cache)
    assert ranked.returncode == 0, ranked.stderr
    best_t, best_c = synthetic.optimum()  # the predicted fastest within the budget, first
    assert ranked.stdout.startswith(f"grid over {len(points)} candidates")
    first_line = ranked.stdout.splitlines()[1]
    assert first_line.startswith(f"[1/2] batch_size={best_c['batch_size']} ckpt_ratio="
                                 f"{best_c['ckpt_ratio']:g}: ok {best_t:.4g}"), first_line
    assert len(predicted.read_text().splitlines()) == len(points)  # the cache file answered


def _error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr)
    return lines[0]


def test_prediction_mistakes_are_one_line_errors(tmp_path):
    command = f"command = {OBJECTIVE!r}\n"
    prune = ["--strategy", "grid", "--prune-predicted-oom", "0.1"]
    cases = [
        ("predict = 42\n", prune,
         "space.py:6: the predict command is 42, not a string or a list of strings"),
        (f"predict = {PREDICT[:-1] + ['{ratio}']!r}\n", prune,
         "space.py:6: placeholder(s) {ratio} in the predict command name no symbol"),
        ("memory_budget_gb = -1\n", prune, "space.py:6: `memory_budget_gb` is -1, not a "
         "positive number"),
        ("", ["--rank-by-prediction"], "--rank-by-prediction need(s) a `predict` command"),
        (f"predict = {PREDICT!r}\n", prune, "pruning predicted OOMs needs a memory budget"),
        (f"predict = {PREDICT!r}\nmemory_budget_gb = 48\n", ["--trust-predicted-oom"],
         "trusting predicted OOMs needs pruning"),
        (f"predict = {PREDICT + ['--garbage']!r}\nmemory_budget_gb = 48\n", prune,
         "space.py:6: the predict command"),
    ]
    for extra, args, message in cases:
        line = _error(_tune(_space_file(tmp_path, command + extra), *args))
        assert line.startswith("slapo.autotune: error: ") and message in line, (extra, line)
    assert "no JSON prediction line: the simulator crashed" in line and "Hint: it must exit 0" \
        in line
