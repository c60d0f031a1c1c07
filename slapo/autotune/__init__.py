"""Auto-tuning of schedule and training knobs (the paper's Figure 10).

Declare a finite :class:`Space` in Python (symbols with ranges or choices, derived values,
constraints), give an objective (a Python callable, or a command run per candidate that prints a
JSON result), and run a strategy: ``grid`` (every candidate), ``search`` (the original tuner's
OOM-aware search over batch size x checkpoint ratio) or ``tpe`` (Optuna's TPE). Every candidate
is stored in an Optuna study (SQLite), with its status (``ok``/``oom``/``fail``/``timeout``),
parameters, throughput and memory, so a killed study resumes without re-running finished
candidates::

    from slapo.autotune import Space, tune

    space = Space()
    space.int("batch_size", 4, 32, step=4)
    space.float("ckpt_ratio", 0.0, 1.0, step=0.25)
    result = tune(space, my_benchmark, strategy="search", budget=20, db="study.db")
    print(result.best.values, result.best.throughput)

Command line: ``python -m slapo.autotune --space FILE --strategy grid|search|tpe --budget N
--db FILE -- COMMAND ...`` (:mod:`slapo.autotune.cli`). API reference: ``docs/autotune.md``.
A :class:`PredictionPolicy` (``tune(..., prediction=...)``; :mod:`slapo.autotune.predict`) lets a
simulator's predictions prune candidates predicted to run out of memory and rank the rest by
predicted throughput before anything runs. This package knows nothing of the benchmark
harness; ``autotune/driver.py`` adapts ``end2end.bench`` to a command objective.
"""

from .objective import (REFUSED, STATUSES, CallableObjective, CommandObjective, Objective,
                        Outcome, as_objective)
from .predict import (CallablePredictor, CommandPredictor, Prediction, PredictionCache,
                      PredictionPolicy, Predictor)
from .space import Space, Symbol
from .strategies import STRATEGIES, TPE, Grid, OOMAwareSearch, make_strategy
from .study import BudgetExhausted, Record, Tuner, load_records
from .tune import TuneResult, tune

__all__ = ["Space", "Symbol", "Objective", "CallableObjective", "CommandObjective", "Outcome",
           "as_objective", "STATUSES", "REFUSED", "Grid", "OOMAwareSearch", "TPE", "STRATEGIES",
           "make_strategy", "Tuner", "Record", "BudgetExhausted", "load_records", "tune",
           "TuneResult", "Prediction", "Predictor", "CallablePredictor", "CommandPredictor",
           "PredictionCache", "PredictionPolicy"]
