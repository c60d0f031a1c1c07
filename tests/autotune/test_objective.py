"""Objectives: what a callable or a command returns becomes an Outcome with a status; bad
results and bad candidates are clear errors."""

import sys

import pytest

from slapo.autotune import CallableObjective, CommandObjective, Outcome, Tuner, as_objective
from slapo.errors import TuneError

from . import synthetic


def test_callable_results_and_exceptions():
    ok = CallableObjective(lambda v: 3)(dict(a=1))
    assert (ok.status, ok.throughput) == ("ok", 3.0)
    d = CallableObjective(lambda v: {"throughput": 2.5, "memory_gb": 1, "note": "x"})({})
    assert (d.status, d.memory_gb, d.extra) == ("ok", 1.0, {"note": "x"})
    oom = CallableObjective(lambda v: {"status": "oom"})({})
    assert oom.status == "oom" and oom.error == "the objective reported status 'oom'"

    def raises(v):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")
    assert CallableObjective(raises)({}).status == "oom"
    with pytest.raises(TuneError, match="an ok outcome needs a finite throughput, got nan"):
        CallableObjective(lambda v: float("nan"))({})
    with pytest.raises(TuneError, match="status 'skipped' is not one of"):
        CallableObjective(lambda v: {"status": "skipped", "error": "e"})({})
    with pytest.raises(TuneError, match="returned 'fast'.*return a throughput"):
        CallableObjective(lambda v: "fast")({})
    with pytest.raises(TuneError, match="is not callable"):
        CallableObjective(42)
    assert isinstance(as_objective(["echo"]), CommandObjective)


def test_command_substitution_environment_and_last_json_line():
    code = ("import json, os; print('{\"not\": json'); print('{\"status\": \"fail\"}'); "
            "print(json.dumps({'throughput': float(os.environ['SLAPO_TUNE_BATCH_SIZE']), "
            "'arg': '{ x}', 'ratio': os.environ['SLAPO_TUNE_CKPT_RATIO']}))")
    obj = CommandObjective([sys.executable, "-c", code, "{batch_size}", "{ckpt_ratio}"])
    assert obj.placeholders() == ["batch_size", "ckpt_ratio"]
    assert obj.render({"batch_size": 8, "ckpt_ratio": 0.5})[-2:] == ["8", "0.5"]
    out = obj({"batch_size": 8, "ckpt_ratio": 0.5})
    assert (out.status, out.throughput) == ("ok", 8.0)
    assert out.extra["arg"] == "{ x}" and out.extra["ratio"] == "0.5"  # not a placeholder
    assert out.extra["returncode"] == 0 and out.extra["seconds"] >= 0
    with pytest.raises(TuneError, match="the objective command is empty"):
        CommandObjective([])
    with pytest.raises(TuneError, match="timeout 0 is not positive"):
        CommandObjective(["true"], timeout=0)
    missing = CommandObjective(["/nonexistent/tool"])({})
    assert missing.status == "fail" and "cannot start" in missing.error


def test_evaluate_refuses_what_is_not_a_candidate():
    with Tuner(synthetic.space(), as_objective(synthetic.objective), budget=3) as tuner:
        with pytest.raises(TuneError, match="is not a candidate of the space: batch_size=5"):
            tuner.evaluate({"batch_size": 5, "ckpt_ratio": 0.0})
        with pytest.raises(TuneError, match="the symbols are \\['batch_size', 'ckpt_ratio'\\]"):
            tuner.evaluate({"batch_size": 8})
        assert tuner.evaluations == 0 and Outcome("timeout", error="t").status == "timeout"


def test_missing_optuna_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna -> ImportError
    with pytest.raises(TuneError, match="needs optuna.*pip install optuna==5.0.0"):
        Tuner(synthetic.space(), as_objective(synthetic.objective), budget=1)


def test_a_command_that_refuses_stops_the_study_and_the_candidate_runs_on_resume(tmp_path):
    """Exit status REFUSED (e.g. autotune.driver --require-quiet on a busy machine): a
    TuneError quoting the command's last stderr line, nothing stored as evaluated; the same
    study resumes with the candidate."""
    from slapo.autotune import REFUSED, Space, load_records, tune

    space = Space("one")
    space.choice("batch_size", [4])
    db = str(tmp_path / "s.db")
    refuse = [sys.executable, "-c", f"import sys; sys.stderr.write('warming up\\nbusy now\\n'); "
              f"sys.exit({REFUSED})"]
    with pytest.raises(TuneError, match=r"refused to evaluate \{'batch_size': 4\}: busy now"):
        tune(space, refuse, db=db)
    assert not [r for r in load_records(db, "grid") if r.evaluated]
    result = tune(space, [sys.executable, "-c", "print('{\"throughput\": 2.0}')"], db=db)
    assert result.run_now == 1 and result.best.throughput == 2.0
