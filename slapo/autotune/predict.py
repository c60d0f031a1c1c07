"""Predictions: what a simulator says about a candidate before it runs, and what the tuner does
with it (prune a predicted OOM, rank candidates by predicted throughput).

A :class:`Predictor` answers ``predictor(values) -> Prediction`` without training anything: a
Python callable (:class:`CallablePredictor`), or a command run per candidate
(:class:`CommandPredictor`, the space file's ``predict``, with the same ``{symbol}``
placeholders as its ``command``) that prints one JSON line::

    {"status": "sim", "memory_gb": 1.21, "samples_per_s": 3.4, "error": ""}

``status`` is ``sim`` (predicted to run), ``sim-oom`` (the predictor's own judgement that it
runs out of memory), ``fail`` (predicted to fail as a real run would, e.g. an invalid layout) or
``timeout`` (the prediction took too long); ``memory_gb`` is the predicted peak memory per rank
in the unit the objective reports, ``samples_per_s`` the predicted throughput. In this
repository ``python -m end2end.simulate.one`` is such a command (``autotune/spaces/bert.py``).

:class:`PredictionPolicy` says what the tuner does with the predictions
(``docs/autotune.md``, "Pruning and ranking by a prediction"):

* ``prune_margin`` M: a candidate is **pruned** (stored with status ``pruned``, never run, not
  counted in the budget) when its predicted memory exceeds the space's memory budget by more
  than the margin: ``memory_gb > memory_budget_gb x (1 + M)``. The margin is the error the
  prediction is allowed: with M = 0.1 a candidate predicted 9 % over the budget still runs. A
  ``sim-oom``, ``fail`` or ``timeout`` status alone prunes nothing: the budget is the space's.
* ``rank``: candidates are predicted up front and ordered by predicted throughput, those
  predicted within the budget first, then the rest, then those without a usable prediction
  (in enumeration order); the grid evaluates in that order, TPE starts from the head of it
  instead of random candidates, the OOM-aware search probes the head first.
* ``trust_oom``: the OOM-aware search's memory proofs (an OOM at batch b and ratio r proves
  every larger batch at a smaller ratio runs out of memory too) accept pruned candidates as
  OOMs. Without it a pruned candidate only "does not fit" for the binary search that met it.

Predictions are cached per candidate and predictor (:class:`PredictionCache`, optionally in a
JSON-lines file that a later session or a replay reads), and every run or pruned candidate keeps
its prediction in its record (``extra["prediction"]``).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from ..errors import TuneError
from .objective import _PLACEHOLDER, _text, json_line, run_command
from .space import Params

__all__ = ["Prediction", "Predictor", "CallablePredictor", "CommandPredictor",
           "PredictionCache", "PredictionPolicy", "PREDICTED_STATUSES", "as_predictor"]

PREDICTED_STATUSES = ("sim", "sim-oom", "fail", "timeout")
_LINE = ('{"status": "sim"|"sim-oom"|"fail", "memory_gb": GB, "samples_per_s": S, '
         '"error": TEXT}')


def _number(value: Any, what: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise TuneError(f"the prediction's {what} is {value!r}, not a finite number >= 0",
                        call="Prediction", hint=f"print one JSON line {_LINE}")
    return float(value)


@dataclass
class Prediction:
    """One candidate's prediction (see the module docstring)."""

    status: str
    memory_gb: Optional[float] = None
    samples_per_s: Optional[float] = None
    error: str = ""
    seconds: float = 0.0
    extra: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in PREDICTED_STATUSES:
            raise TuneError(f"prediction status {self.status!r} is not one of "
                            f"{PREDICTED_STATUSES}", call="Prediction",
                            hint=f"print one JSON line {_LINE}")
        self.memory_gb = _number(self.memory_gb, "memory_gb")
        self.samples_per_s = _number(self.samples_per_s, "samples_per_s")
        if self.status in ("sim", "sim-oom") and self.memory_gb is None:
            raise TuneError(f"a {self.status!r} prediction needs memory_gb", call="Prediction",
                            hint=f"print one JSON line {_LINE}")

    @property
    def usable(self) -> bool:
        """A simulated prediction (``sim``/``sim-oom``): it has a memory and a throughput."""
        return self.status in ("sim", "sim-oom")

    @classmethod
    def from_result(cls, data: Any) -> "Prediction":
        """A Prediction from a dict (``status``, ``memory_gb``, ``samples_per_s``, ``error``;
        other keys go to ``extra``) or a Prediction."""
        if isinstance(data, Prediction):
            return data
        if not isinstance(data, Mapping):
            raise TuneError(f"the predictor returned {data!r} ({type(data).__name__})",
                            call="Prediction", hint=f"return a dict like {_LINE}")
        data = dict(data)
        if "status" not in data:
            raise TuneError(f"the prediction {data} has no status", call="Prediction",
                            hint=f"print one JSON line {_LINE}")
        fields = [data.pop(k, d) for k, d in (("status", None), ("memory_gb", None),
                                               ("samples_per_s", None), ("error", ""),
                                               ("seconds", 0.0))]
        nested = data.pop("extra", None)  # to_dict()'s own extra
        extra = {**data, **nested} if isinstance(nested, Mapping) else data
        return cls(str(fields[0]), fields[1], fields[2], str(fields[3] or ""),
                   float(fields[4] or 0.0), extra)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


class Predictor:
    """Predicts one candidate: ``predictor(values) -> Prediction`` (values with derived ones)."""

    def __call__(self, values: Mapping[str, Any]) -> Prediction:
        raise NotImplementedError

    def describe(self, values: Mapping[str, Any]) -> str:
        """The prediction's identity: its command line (or the callable and its arguments)."""
        return ""


class CallablePredictor(Predictor):
    """A Python function ``fn(values) -> dict | Prediction`` (an exception is a ``fail``)."""

    def __init__(self, fn: Callable[[Dict[str, Any]], Any]):
        if not callable(fn):
            raise TuneError(f"predictor {fn!r} is not callable", call="CallablePredictor")
        self.fn = fn

    def __call__(self, values: Mapping[str, Any]) -> Prediction:
        try:
            result = self.fn(dict(values))
        except Exception as exc:  # noqa: BLE001  (a failed prediction is a prediction)
            return Prediction("fail", error=f"{type(exc).__name__}: {exc}")
        return Prediction.from_result(result)

    def describe(self, values: Mapping[str, Any]) -> str:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"{name}({', '.join(f'{k}={v!r}' for k, v in values.items())})"


class CommandPredictor(Predictor):
    """A command per candidate that prints the prediction as its last JSON line (module
    docstring). ``{name}`` in its arguments is the candidate's value of ``name``. A command
    that cannot start, exits non-zero or prints no valid prediction line is a mistake of the
    template, raised as :class:`TuneError` with the command and its last lines; running longer
    than ``timeout`` seconds is a ``timeout`` prediction."""

    def __init__(self, command: Union[str, Sequence[str]], timeout: Optional[float] = None,
                 where: str = "CommandPredictor"):
        if isinstance(command, str):
            command = shlex.split(command)
        if isinstance(command, (bytes, Mapping)) or not isinstance(command, Sequence) \
                or not all(isinstance(a, str) for a in command):
            raise TuneError(f"{where}: the predict command is {command!r}, not a string or a "
                            "list of strings",
                            hint="predict = ['python', '-m', 'my.simulator', '--batch', "
                            "'{batch_size}']")
        self.command, self.where = list(command), where
        if not self.command:
            raise TuneError(f"{where}: the predict command is empty",
                            hint="give the command that prints the prediction line")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(
                timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0):
            raise TuneError(f"{where}: predict timeout {timeout!r} is not a positive number of "
                            "seconds")
        self.timeout = timeout

    def check(self, names: Sequence[str]) -> None:
        """Raise :class:`TuneError` for a placeholder that names no symbol or derived value."""
        found = [m for a in self.command for m in _PLACEHOLDER.findall(a)]
        unknown = list(dict.fromkeys(p for p in found if p not in names))
        if unknown:
            raise TuneError(f"{self.where}: placeholder(s) "
                            f"{', '.join('{%s}' % u for u in unknown)} in the predict command "
                            "name no symbol or derived value",
                            hint=f"known: {', '.join(names)}")

    def render(self, values: Mapping[str, Any]) -> List[str]:
        """The command line of one candidate."""
        subst = {k: _text(v) for k, v in values.items()}
        return [_PLACEHOLDER.sub(lambda m: subst.get(m.group(1), m.group(0)), a)
                for a in self.command]

    def describe(self, values: Mapping[str, Any]) -> str:
        return shlex.join(self.render(values))

    def __call__(self, values: Mapping[str, Any]) -> Prediction:
        argv = self.render(values)
        run = run_command(argv, self.timeout, {})
        if run.timed_out:
            return Prediction("timeout", error=f"no prediction after {self.timeout:g} s",
                              seconds=run.seconds)
        problem = run.started
        data = None if problem else json_line(run.stdout)
        if problem is None and (run.returncode != 0 or data is None):
            tail = " | ".join((run.stderr or run.stdout).strip().splitlines()[-3:])
            problem = f"exit status {run.returncode}, no JSON prediction line: {tail}"
        if problem is None:
            try:
                prediction = Prediction.from_result(data)
            except TuneError as exc:
                problem = " ".join(str(exc).split())
        if problem is not None:
            raise TuneError(f"{self.where}: the predict command {shlex.join(argv)} failed: "
                            f"{problem}",
                            hint=f"it must exit 0 and print one JSON line {_LINE}")
        prediction.seconds = prediction.seconds or run.seconds
        return prediction


def as_predictor(obj: Union[Predictor, Callable, Sequence[str], str],
                 timeout: Optional[float] = None) -> Predictor:
    """A :class:`Predictor` from a predictor, a callable, or a command (list or string)."""
    if isinstance(obj, Predictor):
        return obj
    if callable(obj):
        return CallablePredictor(obj)
    return CommandPredictor(obj, timeout=timeout)


class PredictionCache:
    """Predictions by the predictor's description of the candidate (its command line), in
    memory and, with ``path``, in a JSON-lines file (one ``{"params", "command",
    "prediction"}`` per line, appended as predictions are made, read back on open).
    ``offline``: a candidate missing from the cache is a :class:`TuneError` instead of a run of
    the predictor (a replay that must not simulate)."""

    def __init__(self, path: Optional[str] = None, offline: bool = False):
        self.path, self.offline = path, offline
        self._known: Dict[str, Prediction] = {}
        if path and os.path.exists(path):
            self._load(path)

    def _load(self, path: str) -> None:
        with open(path) as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                    self._known[item["command"]] = Prediction.from_result(item["prediction"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise TuneError(f"{path}:{number}: not a prediction line ({exc})",
                                    call="PredictionCache",
                                    hint="each line is {\"params\", \"command\", \"prediction\"}"
                                    "; delete the file to predict again") from None

    def get(self, predictor: Predictor, params: Params, values: Mapping[str, Any]
            ) -> Prediction:
        """The cached prediction of the candidate, made (and stored) if missing."""
        key = predictor.describe(values)
        if key in self._known:
            return self._known[key]
        if self.offline:
            raise TuneError(f"no prediction of {params} ({key}) in {self.path}",
                            call="PredictionCache",
                            hint="predict every candidate first (python -m autotune.pruning "
                            "--simulate)")
        began = time.time()
        prediction = predictor(values)
        prediction.seconds = prediction.seconds or round(time.time() - began, 3)
        self.put(key, params, prediction)
        return prediction

    def remember(self, key: str, prediction: Prediction) -> None:
        """Know ``prediction`` for ``key`` without writing it to the file (it is stored
        elsewhere, e.g. in the study)."""
        self._known.setdefault(key, prediction)

    def put(self, key: str, params: Params, prediction: Prediction) -> None:
        self._known[key] = prediction
        if self.path:
            with open(self.path, "a") as fh:
                fh.write(json.dumps({"params": params, "command": key,
                                     "prediction": prediction.to_dict()}, default=str) + "\n")

    def __len__(self) -> int:
        return len(self._known)


@dataclass
class PredictionPolicy:
    """What the tuner does with predictions (see the module docstring)."""

    predictor: Predictor
    memory_budget_gb: Optional[float] = None
    prune_margin: Optional[float] = None
    rank: bool = False
    trust_oom: bool = False
    cache: PredictionCache = field(default_factory=PredictionCache)

    def __post_init__(self):
        call = "PredictionPolicy"
        self.predictor = as_predictor(self.predictor)
        m = self.prune_margin
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float))
                              or not math.isfinite(m) or m < 0):
            raise TuneError(f"prune margin {m!r} is not a number >= 0", call=call,
                            hint="0.1 prunes a candidate predicted more than 10 % over the "
                            "memory budget")
        b = self.memory_budget_gb
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float))
                              or not math.isfinite(b) or b <= 0):
            raise TuneError(f"memory budget {b!r} GB is not a positive number", call=call)
        if m is not None and b is None:
            raise TuneError("pruning predicted OOMs needs a memory budget", call=call,
                            hint="set memory_budget_gb in the space file (the memory per rank "
                            "a run may use; on a GPU its memory)")
        if self.trust_oom and m is None:
            raise TuneError("trusting predicted OOMs needs pruning (a prune margin)", call=call,
                            hint="add --prune-predicted-oom MARGIN")

    @property
    def prunes(self) -> bool:
        return self.prune_margin is not None

    def predict(self, params: Params, values: Mapping[str, Any]) -> Prediction:
        """The (cached) prediction of one candidate."""
        return self.cache.get(self.predictor, params, values)

    def predicted_oom(self, prediction: Prediction) -> Optional[str]:
        """Why the candidate is pruned (the prune rule), or None."""
        if not self.prunes or not prediction.usable:
            return None
        limit = self.memory_budget_gb * (1 + self.prune_margin)
        if prediction.memory_gb <= limit:
            return None
        return (f"predicted {prediction.memory_gb:.3g} GB per rank > budget "
                f"{self.memory_budget_gb:g} GB x (1 + margin {self.prune_margin:g})")

    def order(self, candidates: Sequence[Params], predictions: Sequence[Prediction]
              ) -> List[Params]:
        """``candidates`` ranked (module docstring): predicted to fit by falling predicted
        throughput, then predicted over the budget likewise, then unusable predictions."""
        def key(i: int):
            p = predictions[i]
            if not p.usable or p.samples_per_s is None:
                return (2, 0.0, i)
            over = self.memory_budget_gb is not None and p.memory_gb > self.memory_budget_gb
            return (1 if over or p.status == "sim-oom" else 0, -p.samples_per_s, i)
        return [dict(candidates[i]) for i in sorted(range(len(candidates)), key=key)]
