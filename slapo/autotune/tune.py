"""``tune()``: one strategy over a space and an objective, stored in a study; the result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Union

from .objective import Objective, as_objective
from .predict import PredictionPolicy
from .space import Params, Space
from .strategies import make_strategy
from .study import BudgetExhausted, Record, Tuner

__all__ = ["tune", "TuneResult"]


@dataclass
class TuneResult:
    """What a tuning session ends with.

    ``best``: the ok evaluation with the highest throughput (None if none ran ok);
    ``evaluated``: every evaluated candidate of the study in order (earlier sessions included);
    ``run_now``: how many were run in this session; ``skipped``: candidates the OOM-aware search
    proved to run out of memory and never ran; ``stopped``: why the session ended
    (``done``, ``budget`` or ``early stop``/``exhausted`` as the strategy reports it);
    ``pruned``: candidates a prediction pruned (not run, not in ``evaluated``).
    """

    best: Optional[Record]
    evaluated: List[Record]
    run_now: int
    stopped: str
    study: str
    db: Optional[str]
    skipped: List[Params] = field(default_factory=list)
    command: str = ""
    pruned: List[Record] = field(default_factory=list)


def tune(space: Space, objective: Union[Objective, Callable, Sequence[str], str],
         strategy: str = "grid", budget: int = 50, db: Optional[str] = None,
         study: Optional[str] = None, timeout: Optional[float] = None,
         on_record: Optional[Callable[[Record, Tuner], None]] = None,
         prediction: Optional[PredictionPolicy] = None, **options: Any) -> TuneResult:
    """Run ``strategy`` (``grid``, ``search`` or ``tpe``; ``options`` go to its class) on
    ``space`` until it is done or ``budget`` candidates of the study are evaluated.

    ``objective``: a callable, an :class:`Objective`, or a command (``timeout`` seconds per
    candidate). ``db``: an SQLite file (resumable; None keeps the study in memory); ``study``:
    the study's name in it (default: the strategy's name, so one file can hold the grid, the
    search and TPE side by side). ``prediction``: a :class:`PredictionPolicy` that prunes
    candidates predicted to run out of memory and/or ranks them by predicted throughput.
    """
    strat = make_strategy(strategy, **options)
    obj = as_objective(objective, timeout=timeout)
    check = getattr(obj, "check", None)
    if check is not None:
        check([*space.names, *(r.name for r in space.derived)])
    if prediction is not None:
        pcheck = getattr(prediction.predictor, "check", None)
        if pcheck is not None:
            pcheck([*space.names, *(r.name for r in space.derived)])
    with Tuner(space, obj, budget, db=db, study=study or strategy,
               on_record=on_record, prediction=prediction) as tuner:
        stopped = "done"
        try:
            strat(tuner)
        except BudgetExhausted:
            stopped = "budget"
        if stopped == "done" and tuner.evaluations >= budget:
            stopped = "budget"
        best = tuner.best()
        return TuneResult(best=best, evaluated=tuner.evaluated(), run_now=tuner.run_now,
                          stopped=stopped, study=tuner.study.study_name, db=db,
                          skipped=list(getattr(strat, "skipped", [])),
                          command=obj.describe(best.values) if best else "",
                          pruned=tuner.pruned())
