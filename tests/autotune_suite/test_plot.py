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


def test_run_sh_end_to_end_on_a_synthetic_space(tmp_path):
    """autotune/run.sh with a small synthetic space (SPACE=...): the grid measures, the search
    and TPE replay the grid's measurements, the figure is drawn."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from slapo.autotune import load_records

    root = Path(__file__).resolve().parents[2]
    log = tmp_path / "calls.txt"
    space = tmp_path / "space.py"
    space.write_text(
        "import sys\nfrom slapo.autotune import Space\n"
        "space = Space('small')\nspace.int('batch_size', 8, 24, step=8)\n"
        "space.float('ckpt_ratio', 0.0, 1.0, step=0.5)\n"
        f"command = [sys.executable, {str(root / 'tests/autotune/synthetic.py')!r}, "
        f"'--batch', '{{batch_size}}', '--ratio', '{{ckpt_ratio}}', '--log', {str(log)!r}]\n")
    env = dict(os.environ, PYTHON=sys.executable, SPACE=str(space), MODEL="small",
               RESULTS_DIR=str(tmp_path), SEEDS="2")
    proc = subprocess.run(["bash", str(root / "autotune/run.sh")], env=env, text=True,
                          capture_output=True, timeout=300, start_new_session=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(log.read_text().splitlines()) == 9  # the grid, once; the rest is replayed
    db = str(tmp_path / "autotune-small.db")
    for study, budget in (("grid", 9), ("search", 3), ("tpe", 3)):
        records = [r for r in load_records(db, study) if r.evaluated]
        assert 0 < len(records) <= budget
        if study != "grid":
            assert all(r.extra.get("replayed_from") == "grid" for r in records)
    assert (tmp_path / "autotune-small.png").stat().st_size > 10_000
    assert "search: " in proc.stdout and "within 5% of the ground truth" in proc.stdout
    seeds = (tmp_path / "autotune-small-seeds.md").read_text()  # the strategies over seeds
    assert "| search | 1 |" in seeds and "| tpe | 2 |" in seeds


def test_a_database_that_is_missing_or_not_one_is_one_line(tmp_path, capsys):
    missing = tmp_path / "nope.db"
    assert main([str(missing), "-o", str(tmp_path / "fig")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err and not missing.exists()
    assert err == f"autotune.plot: error: {missing}: no such study database. Hint: give the .db " \
                  "file autotune/run.sh wrote (results/autotune-*.db).\n"
    garbage = tmp_path / "text.db"
    garbage.write_text("not a database\n")
    assert main([str(garbage), "-o", str(tmp_path / "fig")]) == 2
    assert capsys.readouterr().err == f"autotune.plot: error: {garbage}: cannot open it as a " \
        "study database (file is not a database). Hint: give the .db file autotune/run.sh wrote.\n"


def test_records_frame_and_summary_by_hand():
    """The best-so-far curve and "within 5 % of the ground truth's best" from a frame of
    hand-made records: the grid's best is 4.0, so 3.8 is within 5 %, 3.0 is not."""
    from autotune.plot import records_frame
    from slapo.autotune.study import Record

    def rec(i, status, thrpt=None):
        return Record(i, {"batch_size": 8 * (i + 1), "ckpt_ratio": 0.5}, {}, status,
                      throughput=thrpt)

    grid = [rec(0, "ok", 1.0), rec(1, "oom"), rec(2, "ok", 4.0)]
    search = [rec(0, "fail"), rec(1, "ok", 3.0), rec(2, "oom"), rec(3, "ok", 2.0),
              rec(4, "ok", 3.8)]
    frame = records_frame({"grid": grid, "search": search})
    assert frame.Eval.tolist() == [1, 2, 3, 1, 2, 3, 4, 5]
    assert str(frame.Throughput.dtype) == "float64" and frame.Throughput.isna().sum() == 3
    best = frame.Best.fillna(-1).tolist()
    assert best == [1.0, 1.0, 4.0, -1, 3.0, 3.0, 3.0, 3.8]
    s = summarise({"grid": grid, "search": search})
    assert s["grid"] == dict(evaluations=3, within_5pct_after=3, oom=1,
                             best={"batch_size": 24, "ckpt_ratio": 0.5, "throughput": 4.0})
    assert s["search"]["within_5pct_after"] == 5 and s["search"]["oom"] == 1
    assert s["search"]["best"]["throughput"] == 3.8
    assert summarise({"grid": [], "search": search})["search"]["within_5pct_after"] is None
