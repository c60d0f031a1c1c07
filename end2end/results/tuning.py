"""The auto-tuning study (Figure 10) read from what it committed: a grid's measured outcomes
from its study database, the strategies' replays over seeds, and a grid predicted by the
simulator (JSON lines of predictions).

``python -m autotune.seeds``, ``autotune.pruning`` and ``autotune.predicted_grid`` make these
files; the report's ``grid``, ``seeds``, ``grid-predicted`` and ``paper`` kinds read them through
this module, below the report (the suites above the harness are never imported by it).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from slapo.autotune import Prediction
from slapo.autotune.study import key_of, load_records
from slapo.errors import TuneError

__all__ = ["SeedRun", "grid_outcomes", "grid_workload", "summarize", "Predictions",
           "load_predictions", "predicted_outcomes", "predicted_optimum"]

Predictions = Dict[str, Prediction]


@dataclass
class SeedRun:
    """One strategy run on the replayed grid: evaluations until within the margin of the
    optimum (None: never within the budget), and the best found as a fraction of the optimum."""

    strategy: str
    seed: int
    evaluations: int
    to_within: Optional[int]
    best_fraction: float
    pruned: int = 0  # candidates a prediction pruned (not run; autotune.pruning)
    oom: int = 0  # evaluations that ran out of memory


def grid_workload(db: str, studies: Sequence[str]) -> str:
    """The model and ranks the grid ``studies`` measured (e.g. "`cpu/bert`, 2 ranks"), from the
    config line each candidate's result carries (``autotune.driver``'s ``config_line``)."""
    found = set()
    for study in studies:
        for r in load_records(db, study):
            line = str(r.extra.get("config_line", "")).strip().splitlines()[-1:]
            words = line[0].split() if line else []
            if len(words) >= 3 and words[2].isdigit():
                found.add((words[1], int(words[2])))
    return "; ".join(f"`{model}`, {n} rank{'s' if n > 1 else ''}"
                     for model, n in sorted(found)) or "workload not recorded"


def grid_outcomes(db: str, studies: Sequence[str]) -> Dict[str, dict]:
    """Candidate key -> outcome dict (``status``, ``throughput``) over the grid ``studies``."""
    seen: Dict[str, List] = {}
    for study in studies:
        for r in load_records(db, study):
            if r.evaluated:
                seen.setdefault(key_of(r.params), []).append(r)
    if not seen:
        raise TuneError(f"no evaluated candidates in {', '.join(studies)} of {db}",
                        hint="measure the grid first: bash autotune/run.sh")
    out = {}
    for key, records in seen.items():
        ok = [r.throughput for r in records if r.status == "ok"]
        if any(r.status == "oom" for r in records):
            out[key] = {"status": "oom", "error": "out of memory in the grid"}
        elif ok:
            out[key] = {"status": "ok", "throughput": statistics.median(ok)}
        else:
            out[key] = {"status": records[0].status, "error": records[0].error}
    return out


def summarize(runs: Sequence[SeedRun], within: float) -> str:
    """A Markdown table: per strategy, runs that came within the margin, the median (range) of
    the evaluations it took them, and the median (range) of the best found."""
    lines = [f"| strategy | runs | within {within:.0%} of the optimum | evaluations until "
             "within (median, range) | best found / optimum (median, range) |",
             "|---|---:|---:|---:|---:|"]
    for strategy in dict.fromkeys(r.strategy for r in runs):
        mine = [r for r in runs if r.strategy == strategy]
        hit = [r.to_within for r in mine if r.to_within is not None]
        frac = [r.best_fraction for r in mine]
        evals = (f"{statistics.median(hit):g} ({min(hit)}-{max(hit)})" if hit else "never")
        lines.append(f"| {strategy} | {len(mine)} | {len(hit)} of {len(mine)} | {evals} | "
                     f"{statistics.median(frac):.3f} ({min(frac):.3f}-{max(frac):.3f}) |")
    return "\n".join(lines)


def load_predictions(path: str) -> Predictions:
    """Candidate key -> prediction, from a JSON-lines file (missing file: nothing)."""
    out: Predictions = {}
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        return out
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                item = json.loads(line)
                out[key_of(item["params"])] = Prediction.from_result(item["prediction"])
            except (ValueError, KeyError, TypeError) as exc:
                raise TuneError(f"{path}:{number}: not a prediction line ({exc})",
                                hint='each line is {"params": {...}, "prediction": {...}}'
                                ) from None
    return out


def predicted_outcomes(predictions: Dict[str, Prediction]) -> Dict[str, dict]:
    """Candidate key -> the outcome a replay reads (``status``, ``throughput``), from its
    prediction."""
    out = {}
    for key, p in predictions.items():
        if p.status == "sim" and p.samples_per_s is not None:
            out[key] = {"status": "ok", "throughput": p.samples_per_s,
                        "memory_gb": p.memory_gb}
        elif p.status == "sim-oom":
            out[key] = {"status": "oom", "error": p.error or "predicted out of memory"}
        else:
            out[key] = {"status": "fail", "error": f"predicted {p.status}: {p.error}"}
    return out


def predicted_optimum(outcomes: Dict[str, dict]) -> tuple:
    """(candidate key, outcome) of the highest predicted throughput among those that fit."""
    fits = [(k, o) for k, o in outcomes.items() if o["status"] == "ok"]
    if not fits:
        raise TuneError("no candidate is predicted to fit", call="autotune.predicted_grid",
                        hint="check the predictions file (every candidate sim-oom or fail?)")
    return max(fits, key=lambda item: item[1]["throughput"])
