"""The study database (Optuna, SQLite): every candidate stored with its status, parameters,
throughput and memory; resume after an interruption without re-running finished candidates;
one tuner per database; a changed space refused."""

import optuna
import pytest
from optuna.trial import TrialState

from slapo.autotune import Tuner, as_objective, load_records, tune
from slapo.errors import TuneError

from . import synthetic


class Stop(BaseException):
    """Stands for a kill: not an Exception, so nothing in the tuner catches it."""


def test_every_candidate_is_stored_with_status_and_metrics(tmp_path):
    db = str(tmp_path / "study.db")

    def objective(values):
        if values["batch_size"] == 4 and values["ckpt_ratio"] == 1.0:
            raise RuntimeError("boom")
        return synthetic.objective(values)

    result = tune(synthetic.space(), objective, strategy="grid", budget=100, db=db)
    study = optuna.load_study(study_name="grid", storage=f"sqlite:///{db}")
    trials = study.get_trials()
    assert len(trials) == len(result.evaluated) == 48
    by_status = {}
    for t in trials:
        by_status.setdefault(t.user_attrs["status"], []).append(t)
        b, r = t.params["batch_size"], t.params["ckpt_ratio"]
        assert t.user_attrs["values"] == {"batch_size": b, "ckpt_ratio": r}
    assert set(by_status) == {"ok", "oom", "fail"}
    for t in by_status["ok"]:
        b, r = t.params["batch_size"], t.params["ckpt_ratio"]
        assert t.state == TrialState.COMPLETE and t.value == pytest.approx(
            synthetic.throughput(b, r)) == t.user_attrs["throughput"]
        assert t.user_attrs["memory_gb"] == pytest.approx(synthetic.memory(b, r))
    for t in by_status["oom"]:
        assert t.state == TrialState.PRUNED and t.user_attrs["throughput"] is None
        assert "synthetic OOM" in t.user_attrs["error"]
    assert [t.user_attrs["error"] for t in by_status["fail"]] == ["RuntimeError: boom"]
    assert by_status["fail"][0].state == TrialState.FAIL
    records = load_records(db, "grid")
    assert [r.status for r in records] == [t.user_attrs["status"] for t in trials]
    with pytest.raises(TuneError, match="no study 'tpe' in .*studies there: grid"):
        load_records(db, "tpe")


@pytest.mark.parametrize("strategy", ["grid", "search", "tpe"])
def test_resume_after_an_interruption_runs_no_finished_candidate_again(tmp_path, strategy):
    db, k = str(tmp_path / "study.db"), 4
    first = []

    def interrupted(values):
        if len(first) == k:
            raise Stop  # the tuner dies while the (k+1)-th candidate runs
        first.append(values)
        return synthetic.objective(values)

    with pytest.raises(Stop):
        tune(synthetic.space(), interrupted, strategy=strategy, budget=12, db=db)
    second = []

    def counting(values):
        second.append(values)
        return synthetic.objective(values)

    result = tune(synthetic.space(), counting, strategy=strategy, budget=12, db=db)
    assert not any(v in first for v in second), "a finished candidate ran again"
    assert len(result.evaluated) == len(first) + len(second)
    assert result.run_now == len(second) and len(result.evaluated) <= 12
    records = load_records(db, strategy)
    interrupted_records = [r for r in records if r.status == "interrupted"]
    assert len(interrupted_records) == 1 and "stopped before" in interrupted_records[0].error
    if strategy != "tpe":  # deterministic: the same candidates as one uninterrupted run
        whole = tune(synthetic.space(), synthetic.objective, strategy=strategy, budget=12)
        assert [r.params for r in result.evaluated] == [r.params for r in whole.evaluated]


def test_one_tuner_per_database_and_the_space_must_match(tmp_path):
    db = str(tmp_path / "study.db")
    objective = as_objective(synthetic.objective)
    with Tuner(synthetic.space(), objective, budget=3, db=db, study="s"):
        with pytest.raises(TuneError, match="another tuner is using .*study.db"):
            Tuner(synthetic.space(), objective, budget=3, db=db, study="s")
    other = synthetic.space()
    other.constrain(lambda c: c["batch_size"] > 4, "not the smallest batch")
    with pytest.raises(TuneError, match="study 's' in .* was made with another space"):
        Tuner(other, objective, budget=3, db=db, study="s")
    with Tuner(synthetic.space(), objective, budget=3, db=db, study="s"):
        pass  # the lock was released by the failed open
    with pytest.raises(TuneError, match="budget 0 is not a positive integer"):
        Tuner(synthetic.space(), objective, budget=0)


def test_budget_counts_all_sessions(tmp_path):
    db = str(tmp_path / "study.db")
    one = tune(synthetic.space(), synthetic.objective, strategy="grid", budget=5, db=db)
    assert one.stopped == "budget" and one.run_now == 5
    again = tune(synthetic.space(), synthetic.objective, strategy="grid", budget=5, db=db)
    assert again.run_now == 0 and len(again.evaluated) == 5
    more = tune(synthetic.space(), synthetic.objective, strategy="grid", budget=8, db=db)
    assert more.run_now == 3 and [r.params for r in more.evaluated] == \
        synthetic.space().candidates()[:8]
