"""``python -m autotune.seeds`` (issue 26): strategies replayed over seeds on one measured grid,
reported as medians and ranges, nothing measured again."""

import json

import pytest

from autotune.seeds import main, replay_strategy
from end2end.results.tuning import grid_outcomes
from slapo.autotune import tune
from slapo.autotune.cli import load_space_file

SPACE = "autotune/spaces/bert.py"


def _throughput(v, scale=1.0):
    """A made-up grid: faster with the batch, slower with checkpointing, OOM at large batches
    without enough checkpointing (the shape of the measured one)."""
    if v["batch_size"] >= 16 and v["ckpt_ratio"] < 0.5:
        return {"status": "oom", "error": "out of memory"}
    return scale * v["batch_size"] * (1.0 - 0.3 * v["ckpt_ratio"])


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """Two grid studies in one database (SQLite writes are slow here: made once)."""
    path = str(tmp_path_factory.mktemp("seeds") / "study.db")
    space = load_space_file(SPACE)["space"]
    tune(space, _throughput, strategy="grid", budget=100, db=path, study="grid")
    tune(space, lambda v: _throughput(v, 1.2), strategy="grid", budget=100, db=path,
         study="grid-2")
    return path


def test_grids_combine_as_medians_and_an_oom_anywhere_is_an_oom(db):
    one = grid_outcomes(db, ["grid"])
    both = grid_outcomes(db, ["grid", "grid-2"])
    assert len(one) == len(both) == 25
    key = json.dumps({"batch_size": 8, "ckpt_ratio": 0.5}, sort_keys=True)
    assert one[key]["throughput"] == pytest.approx(8 * 0.85)
    assert both[key]["throughput"] == pytest.approx(8 * 0.85 * 1.1)  # median of 1.0x and 1.2x
    oom = json.dumps({"batch_size": 20, "ckpt_ratio": 0.0}, sort_keys=True)
    assert both[oom]["status"] == "oom"


def test_a_budget_that_covers_the_grid_always_finds_the_optimum(db):
    space = load_space_file(SPACE)["space"]
    grid = grid_outcomes(db, ["grid"])
    for seed in range(3):
        run = replay_strategy(space, grid, "tpe", 25, seed, 0.05)
        assert run.best_fraction == pytest.approx(1.0) and run.to_within is not None
    small = [replay_strategy(space, grid, "tpe", 3, seed, 0.0) for seed in range(3)]
    assert all(r.evaluations <= 3 and r.best_fraction <= 1.0 for r in small)


def test_the_command_prints_medians_and_ranges_per_strategy(db, tmp_path, capsys):
    out = tmp_path / "runs.jsonl"
    assert main(["--db", db, "--space", SPACE, "--seeds", "4", "--budget", "8",
                 "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| search | 1 |" in table and "| tpe | 4 |" in table
    runs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["strategy"] for r in runs] == ["search"] + ["tpe"] * 4
    assert [r["seed"] for r in runs[1:]] == [0, 1, 2, 3]


def test_an_empty_grid_is_a_one_line_error(tmp_path, capsys):
    assert main(["--db", str(tmp_path / "none.db"), "--space", SPACE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no study 'grid'" in err[0], err
