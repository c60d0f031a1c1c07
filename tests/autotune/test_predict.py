"""Predictions in the tuner (issue 25, item 7): a candidate predicted to run out of memory by more
than the margin is pruned (stored, never run, not in the budget), candidates are ranked by
predicted throughput, the search takes pruned candidates as OOM proofs only when told to, and a
bad prediction (or predictor) is a clear error."""

import sys
from pathlib import Path

import pytest

from slapo.autotune import (CommandPredictor, OOMAwareSearch, Prediction, PredictionCache,
                            PredictionPolicy, Tuner, load_records, tune)
from slapo.autotune.objective import CallableObjective
from slapo.errors import TuneError

from . import synthetic

LIMIT = synthetic.LIMIT
PREDICT = str(Path(__file__).resolve().parent / "synthetic_predict.py")


def exact(values, scale=1.0):
    """A perfect simulator of the synthetic benchmark (memory scaled by ``scale``)."""
    b, r = values["batch_size"], values["ckpt_ratio"]
    return {"status": "sim", "memory_gb": synthetic.memory(b, r) * scale,
            "samples_per_s": synthetic.throughput(b, r)}


PREDICTED = []


def counted(values):
    """:func:`exact`, remembering each prediction asked for."""
    PREDICTED.append(values)
    return exact(values)


class Counting:
    """The synthetic objective, remembering what it ran and in which order."""

    def __init__(self):
        self.calls = []

    def __call__(self, values):
        self.calls.append((values["batch_size"], values["ckpt_ratio"]))
        return synthetic.objective(values)


def _point(params):
    return params["batch_size"], params["ckpt_ratio"]


def test_a_predicted_oom_beyond_the_margin_is_pruned_recorded_and_not_run(tmp_path):
    space, run = synthetic.space(), Counting()
    margin = 0.1
    policy = PredictionPolicy(exact, memory_budget_gb=LIMIT, prune_margin=margin)
    db = str(tmp_path / "s.db")
    result = tune(space, run, strategy="grid", budget=100, db=db, prediction=policy)
    candidates = [_point(c) for c in space.candidates()]
    over = {p for p in candidates if synthetic.memory(*p) > LIMIT * (1 + margin)}
    oom_within_margin = {p for p in candidates if LIMIT < synthetic.memory(*p) <= LIMIT * 1.1}
    assert over and oom_within_margin  # the space exercises both sides of the margin
    assert {_point(r.params) for r in result.pruned} == over
    assert set(run.calls) == set(candidates) - over  # pruned ones never ran, the rest all did
    assert oom_within_margin <= set(run.calls)  # within the margin: still run (and OOM)
    assert len(result.evaluated) == len(candidates) - len(over)  # pruning spends no budget
    best_t, best_c = synthetic.optimum()
    assert result.best.throughput == pytest.approx(best_t) and result.best.params == best_c
    stored = [r for r in load_records(db, "grid") if r.status == "pruned"]
    assert {_point(r.params) for r in stored} == over
    one = stored[0]
    assert "> budget 48 GB x (1 + margin 0.1)" in one.error
    assert one.extra["prediction"]["memory_gb"] == pytest.approx(synthetic.memory(*_point(
        one.params)))
    assert not any(r.evaluated for r in stored)


def test_a_resumed_study_keeps_its_pruned_candidates_and_runs_them_without_the_policy(tmp_path):
    space, db = synthetic.space(), str(tmp_path / "s.db")
    PREDICTED.clear()
    policy = PredictionPolicy(counted, memory_budget_gb=LIMIT, prune_margin=0.0)
    first = tune(space, Counting(), strategy="grid", budget=100, db=db, prediction=policy)
    assert len(PREDICTED) == len(space.candidates())
    again = PredictionPolicy(counted, memory_budget_gb=LIMIT, prune_margin=0.0)
    run = Counting()
    tune(space, run, strategy="grid", budget=100, db=db, prediction=again)
    assert run.calls == [] and len(PREDICTED) == len(space.candidates())  # the study answers
    assert sum(r.status == "pruned" for r in load_records(db, "grid")) == len(first.pruned)
    plain = Counting()
    tune(space, plain, strategy="grid", budget=100, db=db)
    assert set(plain.calls) == {_point(r.params) for r in first.pruned}


def test_ranking_orders_the_grid_tpe_startup_and_the_searchs_first_probe():
    space = synthetic.space()

    def predictor(v):
        if v["batch_size"] == 4:
            return {"status": "fail", "error": "the simulator gave up"}
        return exact(v)
    policy = PredictionPolicy(predictor, memory_budget_gb=LIMIT, rank=True)
    run = Counting()
    tune(space, run, strategy="grid", budget=100, prediction=policy)
    points = [_point(c) for c in space.candidates()]
    fits = sorted((p for p in points if p[0] != 4 and synthetic.memory(*p) <= LIMIT),
                  key=lambda p: -synthetic.throughput(*p))
    over = sorted((p for p in points if p[0] != 4 and synthetic.memory(*p) > LIMIT),
                  key=lambda p: -synthetic.throughput(*p))
    unusable = [p for p in points if p[0] == 4]
    assert run.calls == fits + over + unusable
    tpe = Counting()
    tune(space, tpe, strategy="tpe", budget=6, prediction=policy, seed=3, n_startup_trials=3)
    assert tpe.calls[:3] == fits[:3]
    search = Counting()
    tune(space, search, strategy="search", budget=10, prediction=policy)
    plain = Counting()
    tune(space, plain, strategy="search", budget=10)
    assert search.calls[0] == fits[0] != plain.calls[0]


def _search_after_a_prune(trust):
    """The search on a study that already holds one candidate pruned by a (wrong) prediction:
    (28, 0.8) fits for real; the prediction says 1000 GB."""
    space, run = synthetic.space(), Counting()

    def wrong(v):
        return dict(exact(v), memory_gb=1000.0) if _point(v) == (28, 0.8) else exact(v)
    policy = PredictionPolicy(wrong, memory_budget_gb=LIMIT, prune_margin=0.0,
                              trust_oom=trust)
    search = OOMAwareSearch()
    with Tuner(space, CallableObjective(run), 40, prediction=policy) as tuner:
        assert tuner.evaluate({"batch_size": 28, "ckpt_ratio": 0.8}).status == "pruned"
        search(tuner)
    return run.calls, [_point(p) for p in search.skipped]


def test_the_search_trusts_a_predicted_oom_only_when_asked():
    # a larger batch at a smaller ratio than the pruned (28, 0.8), which fits and is predicted
    # to fit: without trust the search measures it, with trust it is proven OOM and skipped
    dominated = (32, 0.8)
    calls, skipped = _search_after_a_prune(trust=False)
    assert dominated in calls and not skipped
    calls, skipped = _search_after_a_prune(trust=True)
    assert dominated in skipped and dominated not in calls
    assert all(b >= 28 and r <= 0.8 for b, r in skipped)


def test_pruned_candidates_do_not_stall_tpe():
    """Every candidate but three is predicted over the budget: TPE stops when the rest are known
    instead of proposing pruned candidates forever."""
    space, run = synthetic.space(), Counting()
    keep = {(4, 1.0), (8, 1.0), (12, 1.0)}
    policy = PredictionPolicy(lambda v: exact(v, 1.0 if _point(v) in keep else 100.0),
                              memory_budget_gb=LIMIT, prune_margin=0.0)
    result = tune(space, run, strategy="tpe", budget=20, prediction=policy, seed=1)
    assert set(run.calls) == keep and result.stopped == "done"
    assert len(result.pruned) == len(space.candidates()) - 3


def test_prediction_and_policy_errors_say_what_to_fix():
    with pytest.raises(TuneError, match="prediction status 'ok' is not one of"):
        Prediction.from_result({"status": "ok", "memory_gb": 1.0})
    with pytest.raises(TuneError, match="'sim' prediction needs memory_gb"):
        Prediction.from_result({"status": "sim"})
    with pytest.raises(TuneError, match="memory_gb is -1, not a finite number"):
        Prediction("sim", memory_gb=-1)
    with pytest.raises(TuneError, match="needs a memory budget.*memory_budget_gb"):
        PredictionPolicy(exact, prune_margin=0.1)
    with pytest.raises(TuneError, match="needs pruning"):
        PredictionPolicy(exact, memory_budget_gb=1, trust_oom=True)
    with pytest.raises(TuneError, match="prune margin -0.5 is not a number >= 0"):
        PredictionPolicy(exact, memory_budget_gb=1, prune_margin=-0.5)
    with pytest.raises(TuneError, match=r"placeholder\(s\) \{batchsize\}.*known: batch_size"):
        tune(synthetic.space(), synthetic.objective, prediction=PredictionPolicy(
            CommandPredictor(["x", "{batchsize}"]), memory_budget_gb=1, prune_margin=0))
    with pytest.raises(TuneError, match="the predict command is empty"):
        CommandPredictor([])


def test_a_predict_command_that_prints_no_prediction_is_a_clear_error():
    values = {"batch_size": 8, "ckpt_ratio": 0.5}
    good = CommandPredictor([sys.executable, PREDICT, "--batch", "{batch_size}", "--ratio",
                             "{ckpt_ratio}"])
    p = good(values)
    assert p.status == "sim" and p.memory_gb == pytest.approx(synthetic.memory(8, 0.5))
    garbage = CommandPredictor(good.command + ["--garbage"], where="space.py:7")
    with pytest.raises(TuneError, match=r"space.py:7: the predict command .*--garbage failed: "
                       r"exit status 0, no JSON prediction line: the simulator crashed"):
        garbage(values)
    wrong = CommandPredictor(good.command + ["--status", "ok"])
    with pytest.raises(TuneError, match="prediction status 'ok' is not one of"):
        wrong(values)
    missing = CommandPredictor(["/no/such/simulator"])
    with pytest.raises(TuneError, match="cannot start '/no/such/simulator'"):
        missing(values)
    slow = CommandPredictor([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert slow(values).status == "timeout"


def test_the_cache_file_answers_a_later_session_and_refuses_unknown_candidates(tmp_path):
    path = str(tmp_path / "p.jsonl")
    made = []
    cache = PredictionCache(path)
    policy = PredictionPolicy(lambda v: made.append(v) or exact(v), cache=cache)
    params = {"batch_size": 8, "ckpt_ratio": 0.5}
    first = policy.predict(params, params)
    again = PredictionCache(path, offline=True)
    assert again.get(policy.predictor, params, params) == first and len(made) == 1
    other = {"batch_size": 12, "ckpt_ratio": 0.5}
    with pytest.raises(TuneError, match="no prediction of .*12"):
        again.get(policy.predictor, other, other)
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(TuneError, match="bad.jsonl:1: not a prediction line"):
        PredictionCache(str(tmp_path / "bad.jsonl"))
    assert len(Path(path).read_text().splitlines()) == 1
