"""Each strategy on a synthetic objective with a known optimum and an out-of-memory region
(tests/autotune/synthetic.py): the grid is the ground truth, the OOM-aware search never runs a
candidate it can prove will OOM, TPE finds the optimum within a third of the grid's evaluations."""

import pytest

from slapo.autotune import TPE, BudgetExhausted, OOMAwareSearch, Tuner, as_objective, tune
from slapo.errors import TuneError

from . import synthetic


def _counting(objective):
    calls = []

    def fn(values):
        calls.append((values["batch_size"], values["ckpt_ratio"]))
        return objective(values)
    return fn, calls


def _proven_oom(point, ooms):
    b, r = point
    return any(ob <= b and orr >= r for ob, orr in ooms)


def test_grid_evaluates_every_candidate_once_and_finds_the_optimum():
    fn, calls = _counting(synthetic.objective)
    result = tune(synthetic.space(), fn, strategy="grid", budget=100)
    space = synthetic.space()
    assert calls == [(c["batch_size"], c["ckpt_ratio"]) for c in space.candidates()]
    best_t, best_c = synthetic.optimum()
    assert result.best.params == best_c and result.best.throughput == pytest.approx(best_t)
    statuses = {(r.params["batch_size"], r.params["ckpt_ratio"]): r.status
                for r in result.evaluated}
    for (b, r), status in statuses.items():
        assert status == ("oom" if synthetic.memory(b, r) > synthetic.LIMIT else "ok")
    assert "oom" in statuses.values() and result.stopped == "done"
    oom = next(r for r in result.evaluated if r.status == "oom")
    assert oom.throughput is None and "synthetic OOM" in oom.error


def test_search_never_runs_a_provable_oom_and_finds_the_optimum():
    fn, calls = _counting(synthetic.objective)
    strategy = OOMAwareSearch()
    with Tuner(synthetic.space(), as_objective(fn), budget=100) as tuner:
        strategy(tuner)
        evaluated = tuner.evaluated()
    ooms = []
    for b, r in calls:  # in the order they ran
        assert not _proven_oom((b, r), ooms), f"ran {(b, r)} after OOMs at {ooms}"
        if synthetic.memory(b, r) > synthetic.LIMIT:
            ooms.append((b, r))
    assert len(calls) == len(set(calls)) == len(evaluated)
    best = max((r for r in evaluated if r.status == "ok"), key=lambda r: r.throughput)
    assert best.params == synthetic.optimum()[1]
    grid = len(synthetic.space().candidates())
    assert len(calls) <= grid // 2, f"{len(calls)} of {grid} candidates"
    assert calls[0] == (32, 1.0)  # the largest batch at the most checkpointing first


def test_search_uses_stored_ooms_as_proofs(tmp_path):
    """An OOM stored by an earlier session proves every larger batch at the same or a smaller
    ratio OOMs: the search never runs them (it records them as skipped)."""
    db = str(tmp_path / "s.db")

    def oom(values):
        raise MemoryError("earlier session: out of memory")

    with Tuner(synthetic.space(), as_objective(oom), budget=1, db=db, study="s") as tuner:
        assert tuner.evaluate({"batch_size": 20, "ckpt_ratio": 1.0}).status == "oom"
    fn, calls = _counting(synthetic.objective)
    strategy = OOMAwareSearch()
    with Tuner(synthetic.space(), as_objective(fn), budget=100, db=db, study="s") as tuner:
        strategy(tuner)
        best = tuner.best()
    assert calls and all(b < 20 for b, _ in calls), calls
    assert {(p["batch_size"], p["ckpt_ratio"]) for p in strategy.skipped} >= {(32, 1.0)}
    assert best.params == {"batch_size": 16, "ckpt_ratio": 0.0}


def test_search_early_stop_and_failures_that_are_not_ooms():
    """A crash is no memory proof (the search goes on below it); patience stops the search."""
    def crashing(values):
        if values["ckpt_ratio"] == 0.0 and values["batch_size"] == 8:
            raise RuntimeError("driver crashed")
        return synthetic.objective(values)

    result = tune(synthetic.space(), crashing, strategy="search", budget=100)
    assert [r.error for r in result.evaluated if r.status == "fail"] == [
        "RuntimeError: driver crashed"]
    assert any(r.params == {"batch_size": 4, "ckpt_ratio": 0.0} for r in result.evaluated)
    short = tune(synthetic.space(), synthetic.objective, strategy="search", budget=100,
                 patience=1)
    assert short.stopped == "done" and len(short.evaluated) < len(result.evaluated)
    with pytest.raises(TuneError, match="needs a numeric symbol 'batch'"):
        tune(synthetic.space(), synthetic.objective, strategy="search", budget=5, batch="batch")


def test_tpe_finds_the_optimum_within_a_third_of_the_grid():
    grid = len(synthetic.space().candidates())
    best_t, best_c = synthetic.optimum()
    result = tune(synthetic.space(), synthetic.objective, strategy="tpe", budget=grid // 3,
                  seed=0)
    assert len(result.evaluated) == grid // 3
    assert result.best.params == best_c and result.best.throughput == pytest.approx(best_t)
    keys = [r.key for r in result.evaluated]
    assert len(keys) == len(set(keys))  # a repeated proposal is not run again
    again = tune(synthetic.space(), synthetic.objective, strategy="tpe", budget=grid // 3,
                 seed=0)
    assert [r.params for r in again.evaluated] == [r.params for r in result.evaluated]
    for seed in range(1, 4):  # other seeds: within 5 % (the noise of a shared machine)
        other = tune(synthetic.space(), synthetic.objective, strategy="tpe",
                     budget=grid // 3, seed=seed)
        assert other.best.throughput >= 0.95 * best_t, (seed, other.best)


def test_tpe_respects_constraints_and_stores_invalid_proposals():
    space = synthetic.space()
    space.constrain(lambda c: c["batch_size"] % 8 == 0, "batch multiple of 8")
    fn, calls = _counting(synthetic.objective)
    with Tuner(space, as_objective(fn), budget=12) as tuner:
        with pytest.raises(BudgetExhausted):
            TPE(seed=0)(tuner)
        statuses = [r.status for r in tuner.records]
    assert all(b % 8 == 0 for b, _ in calls) and len(calls) == 12
    invalid = [r for r in tuner.records if r.status == "invalid"]
    assert invalid and all(r.error == "batch multiple of 8" for r in invalid)
    assert set(statuses) <= {"ok", "oom", "invalid", "duplicate"}
