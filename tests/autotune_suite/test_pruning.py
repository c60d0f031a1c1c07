"""``python -m autotune.pruning`` (issue 25, item 7): the strategies replayed on a measured grid
with and without the simulator's predictions; on a made-up grid whose optimum sits next to the
OOM region, a good prediction saves evaluations and keeps the optimum, a prediction that
overstates memory loses it unless the margin covers the error."""

import json
import sys

import pytest

from autotune.pruning import main
from end2end.results.tuning import load_predictions
from slapo.autotune import tune
from slapo.autotune.cli import load_space_file
from slapo.autotune.study import key_of

BUDGET_GB = 1.3
SPACE_TEXT = f"""
import sys
from slapo.autotune import Space
space = Space("made-up")
space.int("batch_size", 4, 20, step=4)
space.float("ckpt_ratio", 0.0, 1.0, step=0.25)
memory_budget_gb = {BUDGET_GB}
predict = [sys.executable, "-c", "import json, sys; b, r = int(sys.argv[1]), float(sys.argv[2]);"
           " print(json.dumps({{'status': 'sim', 'memory_gb': (0.06 * b * (1.5 - r) + 0.2) * 1.05,"
           " 'samples_per_s': b * (1 - 0.3 * r)}}))", "{{batch_size}}", "{{ckpt_ratio}}"]
"""
OPTIMUM = {"batch_size": 20, "ckpt_ratio": 0.75}


def memory(b, r):
    return 0.06 * b * (1.5 - r) + 0.2


def throughput(b, r):
    return b * (1 - 0.3 * r)


def measured(values):
    """The made-up grid: OOM above the budget; the optimum is (20, 0.75) at 15.5."""
    b, r = values["batch_size"], values["ckpt_ratio"]
    if memory(b, r) > BUDGET_GB:  # the driver's over-budget error names the peak
        return {"status": "oom", "error": f"out of memory budget: peak {memory(b, r):.3f} GB "
                f"per rank after warm-up exceeds --mem-budget-gb {BUDGET_GB:g}"}
    return {"status": "ok", "throughput": throughput(b, r), "memory_gb": memory(b, r)}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("pruning")
    space_file = root / "space.py"
    space_file.write_text(SPACE_TEXT)
    space = load_space_file(str(space_file))["space"]
    db = str(root / "grid.db")
    tune(space, measured, strategy="grid", budget=100, db=db, study="grid")
    return root, str(space_file), db


def _predictions(path, scale):
    """A predictions file: memory overstated by ``scale``, throughput exact."""
    from slapo.autotune.cli import load_space_file as load

    with open(path, "w") as fh:
        for c in load(str(path.parent / "space.py"))["space"].candidates():
            b, r = c["batch_size"], c["ckpt_ratio"]
            fh.write(json.dumps({"params": c, "prediction": {
                "status": "sim", "memory_gb": memory(b, r) * scale,
                "samples_per_s": throughput(b, r)}}) + "\n")
    return str(path)


def _row(table, strategy, variant):
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[:2] == [strategy, variant]:
            return cells
    raise AssertionError(f"no row {strategy} / {variant} in\n{table}")


def test_good_predictions_save_evaluations_and_keep_the_optimum(study, tmp_path, capsys):
    root, space, db = study
    preds = _predictions(root / "good.jsonl", 1.05)
    out = tmp_path / "runs.jsonl"
    assert main(["--db", db, "--space", space, "--predictions", preds, "--margin", "0",
                 "--seeds", "3", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    points = [(b, r) for b in (4, 8, 12, 16, 20) for r in (0, 0.25, 0.5, 0.75, 1)]
    pruned = sum(memory(b, r) * 1.05 > BUDGET_GB for b, r in points)
    oom = sum(memory(b, r) > BUDGET_GB for b, r in points)
    assert (pruned, oom) == (6, 5)  # (12, 0): 1.28 GB fits, predicted 1.34: pruned, no optimum
    assert _row(table, "grid", "none")[3:7] == ["25 (25-25)", "5 (5-5)", "0 (0-0)", "1 of 1"]
    assert _row(table, "grid", "prune 0")[3:7] == [f"{25 - pruned} ({25 - pruned}-"
                                                   f"{25 - pruned})", "0 (0-0)", f"{pruned} ("
                                                   f"{pruned}-{pruned})", "1 of 1"]
    assert _row(table, "grid", "rank")[8].startswith("1 (1-1)")  # the predicted best is first
    assert _row(table, "tpe", "rank + prune 0")[6] == "3 of 3"
    assert f"| 0 | {pruned} | {oom} of {oom} | 0 | 1 | no |" in table
    assert "25 candidates with a measured peak): median +5.0%" in table
    runs = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["variant"] for r in runs} >= {"none", "prune 0", "prune 0 + trust", "rank"}
    assert all(r["evaluations"] == 25 - r["pruned"] for r in runs if r["strategy"] == "grid")


def test_overstated_memory_loses_the_optimum_unless_the_margin_covers_it(study, capsys):
    root, space, db = study
    preds = _predictions(root / "high.jsonl", 1.3)  # (20, 0.75): 1.1 GB measured, 1.43 predicted
    assert main(["--db", db, "--space", space, "--predictions", preds, "--margin", "0",
                 "--margin", "0.2", "--seeds", "2"]) == 0
    table = capsys.readouterr().out
    assert _row(table, "grid", "prune 0")[6] == "0 of 1"
    assert float(_row(table, "grid", "prune 0")[7].split()[0]) < 1
    assert _row(table, "grid", "prune 0.2")[6] == "1 of 1"
    zero = next(line for line in table.splitlines() if line.startswith("| 0 |"))
    assert zero.rstrip().endswith("| yes |")


def test_missing_predictions_are_simulated_with_the_spaces_predict_only_when_asked(
        study, tmp_path, capsys):
    _, space, db = study
    path = tmp_path / "p.jsonl"
    assert main(["--db", db, "--space", space, "--predictions", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "25 candidate(s) have no prediction" in err[0] \
        and "add --simulate" in err[0]
    assert main(["--db", db, "--space", space, "--predictions", str(path), "--simulate",
                 "--seeds", "1"]) == 0
    predictions = load_predictions(str(path))
    assert len(predictions) == 25
    p = predictions[key_of(OPTIMUM)]
    assert p.memory_gb == pytest.approx(memory(20, 0.75) * 1.05)
    assert sys.executable in path.read_text()  # the command line that made each one
