"""The study: every candidate a strategy evaluates, stored in an Optuna study (SQLite).

One Optuna trial per candidate proposal. Its user attributes hold what a results row holds:
``status`` (``ok``/``oom``/``fail``/``timeout``; ``invalid``, ``duplicate`` and ``interrupted``
mark proposals that were not evaluated), ``values`` (symbols and derived values),
``throughput``, ``memory_gb``, ``error``, ``seconds``, ``command`` (how to reproduce it) and the
objective's extra data. The Optuna state follows the status so that Optuna's samplers learn
from it: ``ok`` is COMPLETE with the throughput as the value (maximised), ``oom`` is PRUNED with
the constraint ``memory`` violated (TPE ranks it below every feasible candidate), the others
are FAIL (no information). A candidate **pruned** by a prediction
(:class:`~slapo.autotune.predict.PredictionPolicy`: predicted to run out of memory, so it is not
run and not counted in the budget) is a trial of its own with status ``pruned``, the reason as
its error and the prediction in ``extra``; to Optuna it is PRUNED and infeasible, like an OOM.

**Resume.** The database (``sqlite:///FILE`` through ``optuna.storages.RDBStorage``) is written
as each candidate finishes. Opening a study again reuses its stored outcomes: a strategy that
asks for a finished candidate gets the stored result without running it, and the budget counts
the evaluations of all sessions. A trial left RUNNING by a killed tuner is marked FAIL with
status ``interrupted`` and its candidate runs again. A lock file (``FILE.lock``) keeps a second
tuner off the same database. One database may hold several studies (e.g. one per strategy).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ..errors import TuneError
from ..runtime.owner_lock import OwnerLock, OwnerLockBusy
from .objective import Objective
from .predict import Prediction, PredictionPolicy
from .space import Params, Space

__all__ = ["Record", "Tuner", "BudgetExhausted", "key_of", "load_records", "EVALUATED"]

EVALUATED = ("ok", "oom", "fail", "timeout")


class BudgetExhausted(Exception):
    """Raised inside a strategy when the study has used its evaluation budget."""


def key_of(params: Params) -> str:
    """A candidate's identity in the study (its symbols, in declaration order)."""
    return json.dumps(params, sort_keys=True)


@dataclass
class Record:
    """One stored proposal (see the module docstring)."""

    number: int
    params: Params
    values: Params
    status: str
    throughput: Optional[float] = None
    memory_gb: Optional[float] = None
    error: str = ""
    seconds: float = 0.0
    command: str = ""
    stored: bool = False  # came from an earlier session (not run now)
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def evaluated(self) -> bool:
        return self.status in EVALUATED

    @property
    def key(self) -> str:
        return key_of(self.params)

    @classmethod
    def from_trial(cls, trial) -> "Record":
        a = dict(trial.user_attrs)
        return cls(number=trial.number, params=a.get("params", dict(trial.params)),
                   values=a.get("values", {}), status=a.get("status", "interrupted"),
                   throughput=a.get("throughput"), memory_gb=a.get("memory_gb"),
                   error=a.get("error", ""), seconds=a.get("seconds", 0.0),
                   command=a.get("command", ""), stored=True, extra=a.get("extra", {}))


def import_optuna():
    """``optuna``, or a :class:`TuneError` saying how to install it (an optional dependency)."""
    try:
        import optuna
    except ImportError:
        raise TuneError("slapo.autotune needs optuna (the sampler and the study database)",
                        call="import optuna", hint="pip install optuna==5.0.0 (the pin of "
                        "requirements.txt), or pip install 'slapo[autotune]'") from None
    return optuna


def _storage(db: Optional[str]):
    optuna = import_optuna()

    if db is None:
        return optuna.storages.InMemoryStorage()
    url = db if "://" in db else f"sqlite:///{os.path.abspath(db)}"
    from sqlalchemy.exc import SQLAlchemyError  # optuna's storage layer

    try:
        return optuna.storages.RDBStorage(url)
    except SQLAlchemyError as exc:  # e.g. "file is not a database": the user's --db file
        reason = " ".join(str(getattr(exc, "orig", None) or exc).split())
        raise TuneError(f"{db}: cannot open it as a study database ({reason})",
                        hint="give the .db file an earlier tune wrote, or a new file name"
                        ) from None


def load_records(db: str, study: str) -> List[Record]:
    """Every stored proposal of ``study`` in ``db`` (for reports and figures)."""
    optuna = import_optuna()

    try:
        s = optuna.load_study(study_name=study, storage=_storage(db))
    except KeyError:
        names = [x.study_name for x in optuna.get_all_study_summaries(_storage(db))]
        raise TuneError(f"no study {study!r} in {db}", call="load_records",
                        hint=f"studies there: {', '.join(names) or 'none'}") from None
    return [Record.from_trial(t) for t in s.get_trials(deepcopy=False)]


class Tuner:
    """A strategy's handle on the space, the objective and the study.

    ``evaluate(params)`` returns the candidate's :class:`Record`: the stored one if it was
    evaluated before (in this session or an earlier one), else it runs the objective and stores
    the result. It raises :class:`BudgetExhausted` once ``budget`` evaluations are stored.
    ``on_record(record, tuner)`` is called after every evaluation (progress lines), and after
    every candidate pruned by ``prediction`` (a :class:`PredictionPolicy`; None: nothing is
    predicted).
    """

    def __init__(self, space: Space, objective: Objective, budget: int, db: Optional[str] = None,
                 study: str = "autotune", sampler=None,
                 on_record: Optional[Callable[[Record, "Tuner"], None]] = None,
                 prediction: Optional[PredictionPolicy] = None):
        optuna = import_optuna()

        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise TuneError(f"budget {budget!r} is not a positive integer", call="Tuner",
                            hint="the budget is the number of candidates to evaluate")
        self.space, self.objective, self.budget, self.db = space, objective, budget, db
        self.on_record = on_record
        space.candidates()  # validate the space before anything is stored
        self._lock = _lock(db)
        try:
            self.storage = _storage(db)
            sampler = sampler or optuna.samplers.RandomSampler(seed=0)
            self.study = optuna.create_study(study_name=study, storage=self.storage,
                                             sampler=sampler, direction="maximize",
                                             load_if_exists=True)
            self._check_space(study)
            self._fail_interrupted()
        except BaseException:
            self.close()
            raise
        self.records: List[Record] = [Record.from_trial(t) for t in self.study.get_trials()]
        self._done: Dict[str, Record] = {r.key: r for r in self.records if r.evaluated}
        self.run_now = 0  # evaluations run in this session
        self.prediction = prediction
        self._pruned: Dict[str, Record] = {}
        self._ranking: Optional[List[Params]] = None
        if prediction is not None:
            self._reuse_predictions()

    # -- what strategies use ----------------------------------------------------------------
    @property
    def evaluations(self) -> int:
        """Candidates evaluated in the study (all sessions)."""
        return len(self._done)

    @property
    def remaining(self) -> int:
        return max(0, self.budget - self.evaluations)

    def stored(self, params: Params) -> Optional[Record]:
        """The stored evaluation of ``params``, if any."""
        return self._done.get(key_of(params))

    def known(self, params: Params) -> Optional[Record]:
        """The stored evaluation of ``params``, or its record as pruned by the prediction."""
        key = key_of(params)
        return self._done.get(key) or self._pruned.get(key)

    @property
    def ranks(self) -> bool:
        """Candidates are ranked by their prediction (``PredictionPolicy.rank``)."""
        return self.prediction is not None and self.prediction.rank

    @property
    def trusts_predicted_oom(self) -> bool:
        """A pruned candidate counts as an OOM in memory proofs (``trust_oom``)."""
        return self.prediction is not None and self.prediction.trust_oom

    def ranked_candidates(self) -> List[Params]:
        """The space's candidates, ranked by prediction when the policy ranks (every candidate
        is predicted once, then cached), else in enumeration order."""
        if not self.ranks:
            return self.space.candidates()
        if self._ranking is None:
            candidates = self.space.candidates()
            predictions = [self.prediction.predict(c, self.space.complete(c))
                           for c in candidates]
            self._ranking = self.prediction.order(candidates, predictions)
        return [dict(c) for c in self._ranking]

    def pruned(self) -> List[Record]:
        """Candidates pruned by the prediction (this session and stored ones still pruned)."""
        return sorted(self._pruned.values(), key=lambda r: r.number)

    def evaluate(self, params: Params) -> Record:
        """The outcome of a candidate (stored, or run now through an enqueued Optuna trial;
        a candidate the prediction prunes is stored as ``pruned`` and not run)."""
        done = self.known(params)
        if done is not None:
            return done
        problem = self.space.violated(params) if set(params) == set(self.space.symbols) \
            else f"it gives {sorted(params)}, the symbols are {self.space.names}"
        if problem is not None:
            raise TuneError(f"{params} is not a candidate of the space: {problem}",
                            call="Tuner.evaluate", hint="evaluate one of space.candidates()")
        self.check_budget()
        self.study.enqueue_trial(dict(params), skip_if_exists=False)
        trial = self.study.ask()
        suggested = self.suggest(trial)
        assert suggested == dict(params), (suggested, params)
        return self.run_trial(trial, suggested)

    def suggest(self, trial) -> Params:
        """The trial's candidate: one value per symbol, from Optuna's sampler (or the enqueued
        values)."""
        out: Params = {}
        for name, sym in self.space.symbols.items():
            if sym.kind == "int":
                out[name] = trial.suggest_int(name, int(sym.low), int(sym.high),
                                              step=int(sym.step))
            elif sym.kind == "float":
                out[name] = round(trial.suggest_float(name, sym.low, sym.high, step=sym.step),
                                  12)
            else:
                out[name] = trial.suggest_categorical(name, list(sym.values))
        return out

    def run_trial(self, trial, params: Params) -> Record:
        """Run the objective on ``params`` for an asked trial and store the outcome."""
        self.check_budget()
        values = self.space.complete(params)
        command = self.objective.describe(values)
        prediction = self._predict(params, values)
        reason = self.prediction.predicted_oom(prediction) if prediction else None
        if reason is not None:
            return self._prune(trial, params, values, command, prediction, reason)
        start = time.time()
        outcome = self.objective(values)
        extra = dict(outcome.extra)
        if prediction is not None:
            extra.update(self._prediction_extra(values, prediction))
        record = Record(trial.number, dict(params), values, outcome.status, outcome.throughput,
                        outcome.memory_gb, outcome.error, round(time.time() - start, 3),
                        command, extra=extra)
        self._tell(trial, record)
        self._done[record.key] = record
        self.run_now += 1
        if self.on_record is not None:
            self.on_record(record, self)
        return record

    def _predict(self, params: Params, values: Params) -> Optional[Prediction]:
        """The candidate's prediction when the policy prunes or ranks (else None)."""
        policy = self.prediction
        if policy is None or not (policy.prunes or policy.rank):
            return None
        return policy.predict(params, values)

    def _prediction_extra(self, values: Params, prediction: Prediction) -> Dict[str, Any]:
        return {"prediction": prediction.to_dict(),
                "prediction_command": self.prediction.predictor.describe(values)}

    def _prune(self, trial, params: Params, values: Params, command: str,
               prediction: Prediction, reason: str) -> Record:
        """Store ``params`` as pruned by its prediction (not run, not in the budget)."""
        record = Record(trial.number, dict(params), values, "pruned", error=reason,
                        command=command, extra=self._prediction_extra(values, prediction))
        self._tell(trial, record)
        self._pruned[record.key] = record
        if self.on_record is not None:
            self.on_record(record, self)
        return record

    def _reuse_predictions(self) -> None:
        """Predictions stored with earlier records answer again (no new simulation); a stored
        pruned candidate stays pruned only if the current predictor made its prediction (the
        same command line) and the current policy prunes it too."""
        for r in self.records:
            data, key = r.extra.get("prediction"), r.extra.get("prediction_command")
            if not isinstance(data, dict) or not key:
                continue
            try:
                prediction = Prediction.from_result(data)
            except TuneError:
                continue
            self.prediction.cache.remember(key, prediction)
            if r.status == "pruned" and r.key not in self._done \
                    and key == self.prediction.predictor.describe(self.space.complete(r.params)) \
                    and self.prediction.predicted_oom(prediction) is not None:
                self._pruned[r.key] = r

    def tell_unevaluated(self, trial, params: Params, status: str, like: Optional[Record] = None,
                         reason: str = "") -> Record:
        """Store a proposal that is not run: ``invalid`` (violates ``reason``) or ``duplicate``
        (of ``like``, whose outcome it repeats so that the sampler learns from it)."""
        record = Record(trial.number, dict(params), {}, status, error=reason)
        if like is not None:
            record.throughput, record.memory_gb = like.throughput, like.memory_gb
            record.extra = {"duplicate_of": like.number, "outcome": like.status}
        self._tell(trial, record, like.status if like is not None else "oom")
        return record

    def best(self) -> Optional[Record]:
        """The ok evaluation with the highest throughput (earliest on ties)."""
        ok = [r for r in self._done.values() if r.status == "ok"]
        return max(ok, key=lambda r: (r.throughput, -r.number)) if ok else None

    def evaluated(self) -> List[Record]:
        """Evaluated records in the order they were stored."""
        return sorted(self._done.values(), key=lambda r: r.number)

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> "Tuner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------
    def check_budget(self) -> None:
        """Raise :class:`BudgetExhausted` if the budget is used up."""
        if self.evaluations >= self.budget:
            raise BudgetExhausted

    def _tell(self, trial, record: Record, as_status: Optional[str] = None) -> None:
        from optuna.trial import TrialState

        attrs = dict(status=record.status, params=record.params, values=record.values,
                     throughput=record.throughput, memory_gb=record.memory_gb,
                     error=record.error, seconds=record.seconds, command=record.command,
                     extra=_jsonable(record.extra))
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        status = as_status or record.status
        if status == "ok":
            self.study.tell(trial, record.throughput)
        elif status in ("oom", "pruned"):
            trial.set_constraint("memory", 1.0)
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        self.records.append(record)

    def _check_space(self, study: str) -> None:
        described = self.space.describe()
        stored = self.study.user_attrs.get("space")
        if stored is None:
            self.study.set_user_attr("space", described)
        elif stored != described:
            raise TuneError(f"study {study!r} in {self.db} was made with another space "
                            f"({stored}); this one is ({described})", call="Tuner",
                            hint="use another study name (--study) or database (--db)")

    def _fail_interrupted(self) -> None:
        from optuna.trial import TrialState

        study_id = self.storage.get_study_id_from_name(self.study.study_name)
        for t in self.study.get_trials(deepcopy=False,
                                       states=(TrialState.RUNNING, TrialState.WAITING)):
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            self.storage.set_trial_user_attr(trial_id, "status", "interrupted")
            self.storage.set_trial_user_attr(trial_id, "error",
                                             "the tuner stopped before this candidate finished")
            self.storage.set_trial_state_values(trial_id, TrialState.FAIL)


def _lock(db: Optional[str]) -> Optional[OwnerLock]:
    """One tuner per study database: ``<db>.lock`` (see :mod:`slapo.runtime.owner_lock`)."""
    if db is None or "://" in db:
        return None
    try:
        return OwnerLock(db + ".lock", owner="tuner").acquire()
    except OwnerLockBusy as exc:
        raise TuneError(f"another tuner is using {db} ({exc.owner}; lock {db}.lock)",
                        call="Tuner", hint="wait for it to finish, or use another --db") from None


def _jsonable(data: Dict[str, Any]) -> Dict[str, Any]:
    return json.loads(json.dumps(data, default=str))

