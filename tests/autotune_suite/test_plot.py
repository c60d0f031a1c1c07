"""Figure 10 from a study database only: a fixture database made by the three strategies on the
synthetic objective (tests/autotune/synthetic.py) is drawn and summarised."""

import pytest

from autotune.plot import load_studies, main, summarise
from slapo.autotune import tune
from tests.autotune import synthetic


@pytest.fixture(scope="module")
def fixture_db(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("fig10") / "study.db")
    grid = len(synthetic.space().candidates())
    tune(synthetic.space(), synthetic.objective, strategy="grid", budget=grid, db=db)
    tune(synthetic.space(), synthetic.objective, strategy="search", budget=grid, db=db)
    tune(synthetic.space(), synthetic.objective, strategy="tpe", budget=grid // 3, db=db)
    return db


def test_summary_from_the_database(fixture_db):
    studies = load_studies(fixture_db)
    assert set(studies) == {"grid", "search", "tpe"}
    s = summarise(studies)
    best_t, best_c = synthetic.optimum()
    assert s["grid"]["evaluations"] == len(synthetic.space().candidates())
    assert s["grid"]["best"]["throughput"] == pytest.approx(best_t)
    assert s["search"]["best"]["batch_size"] == best_c["batch_size"]
    assert s["grid"]["oom"] > 0 and s["search"]["oom"] < s["grid"]["oom"]
    assert s["tpe"]["within_5pct_after"] <= s["tpe"]["evaluations"]
    assert s["search"]["within_5pct_after"] < s["grid"]["within_5pct_after"]


def test_figure_files(fixture_db, tmp_path, capsys):
    assert main([fixture_db, "-o", str(tmp_path / "fig10")]) == 0
    out = capsys.readouterr().out
    assert "grid: 48 evaluated" in out and "wrote" in out
    for ext in ("png", "pdf"):
        assert (tmp_path / f"fig10.{ext}").stat().st_size > 10_000


def test_replay_answers_from_the_grid(fixture_db, capsys):
    """run.sh's REPLAY=1: the search over the grid's measurements finds the same best."""
    from autotune.replay import lookup
    from autotune.replay import main as replay_main

    best_t, best_c = synthetic.optimum()
    assert lookup(fixture_db, "grid", best_c)["throughput"] == pytest.approx(best_t)
    assert lookup(fixture_db, "grid", {"batch_size": 32, "ckpt_ratio": 0.0})["status"] == "oom"
    missing = lookup(fixture_db, "grid", {"batch_size": 3, "ckpt_ratio": 0.0})
    assert missing["status"] == "fail" and "was not measured" in missing["error"]
    assert replay_main(["--db", fixture_db, "--param", f"batch_size={best_c['batch_size']}",
                        "--param", f"ckpt_ratio={best_c['ckpt_ratio']}"]) == 0
    assert f'"throughput": {best_t}' in capsys.readouterr().out
    replayed = tune(synthetic.space(), lambda v: lookup(fixture_db, "grid", v),
                    strategy="search", budget=48)
    assert replayed.best.params == best_c
