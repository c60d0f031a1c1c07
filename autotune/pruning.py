"""What the simulator saves the tuner, replayed on a measured grid: ``python -m autotune.pruning
--db DB --space FILE --predictions FILE [--simulate] [--margin M ...]``.

Every strategy (grid, the OOM-aware search, TPE over seeds) is replayed on the grid's
measurements (``autotune.seeds``: several grid studies combine as medians, an OOM anywhere is an
OOM; nothing is measured) once without predictions and once per variant that uses them:
``prune M`` (a candidate predicted above the space's ``memory_budget_gb x (1 + M)`` is not run),
``prune M + trust`` (the search also takes those as OOM proofs), ``rank`` (candidates in
predicted-throughput order: the grid's order, TPE's startup candidates, the search's first
probe) and ``rank + prune M``. Per strategy and variant: evaluations run, candidates pruned,
how many runs still found the grid's optimum within the budget, the best found / the optimum and
the evaluations until within ``--within`` of it (median and range over the runs).

The predictions come from a JSON-lines file (``{"params", "prediction"}`` per line, as
``python -m slapo.autotune --predictions FILE`` writes them); ``--simulate`` first predicts the
candidates it lacks with the space's ``predict`` command (one simulation each: minutes on a
CPU), so the replay itself never simulates. Before the table, how the predictions compare with
the measurements: memory error on the candidates that ran, the rank correlation of throughput,
and per margin the measured OOMs pruned, the ones missed and the candidates that ran fine but
would have been pruned (a pruned optimum is lost).

    python -m autotune.pruning --db results/autotune-bert.db --space autotune/spaces/bert.py \\
        --predictions results/autotune-bert.predictions.jsonl --simulate --margin 0 \\
        --margin 0.1 --seeds 10
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import asdict
from typing import Dict, List, Optional, Sequence, Tuple

from slapo.autotune import CallablePredictor, PredictionPolicy
from slapo.autotune.cli import format_values, load_space_file
from slapo.autotune.study import key_of
from slapo.errors import TuneError

from end2end.results.tuning import Predictions, SeedRun, grid_outcomes, load_predictions

from autotune.seeds import replay_strategy

__all__ = ["simulate_missing", "variants", "policy", "replay_all",
           "quality", "summarize", "main"]

def simulate_missing(ns: dict, predictions: Predictions, path: str, log=print) -> int:
    """Predict every candidate of the space that ``predictions`` lacks with the space file's
    ``predict`` command, appending to ``path``; the number predicted."""
    predictor, space = ns.get("predictor"), ns["space"]
    if predictor is None:
        raise TuneError("--simulate needs a `predict` command in the space file",
                        hint="see autotune/spaces/bert.py")
    todo = [c for c in space.candidates() if key_of(c) not in predictions]
    for i, params in enumerate(todo, 1):
        values = space.complete(params)
        prediction = predictor(values)
        predictions[key_of(params)] = prediction
        with open(path, "a") as fh:
            fh.write(json.dumps({"params": params, "command": predictor.describe(values),
                                 "prediction": prediction.to_dict()}) + "\n")
        log(f"[{i}/{len(todo)}] {format_values(params)}: {prediction.status} "
            f"{prediction.memory_gb} GB, {prediction.samples_per_s} samples/s "
            f"({prediction.seconds:.0f} s)")
    return len(todo)


def variants(margins: Sequence[float]) -> List[Tuple[str, dict]]:
    """(name, PredictionPolicy options) of every variant, the baseline first."""
    out: List[Tuple[str, dict]] = [("none", {})]
    for m in margins:
        out += [(f"prune {m:g}", dict(prune_margin=m)),
                (f"prune {m:g} + trust", dict(prune_margin=m, trust_oom=True))]
    out.append(("rank", dict(rank=True)))
    out += [(f"rank + prune {m:g}", dict(rank=True, prune_margin=m)) for m in margins]
    return out


def policy(options: dict, predictions: Predictions, budget_gb: float, names: Sequence[str]
           ) -> PredictionPolicy:
    """A policy whose predictor answers from ``predictions`` (the candidate's symbols)."""
    def stored_prediction(values):
        return predictions[key_of({n: values[n] for n in names})]

    return PredictionPolicy(CallablePredictor(stored_prediction), memory_budget_gb=budget_gb,
                            **options)


def replay_all(space, grid: Dict[str, dict], predictions: Predictions, budget_gb: float,
               margins: Sequence[float], seeds: int, budgets: Dict[str, int], within: float
               ) -> List[Tuple[str, SeedRun]]:
    """Every (variant, run): the grid and the search once, TPE once per seed."""
    runs: List[Tuple[str, SeedRun]] = []
    plan = [("grid", 0), ("search", 0)] + [("tpe", s) for s in range(seeds)]
    for name, options in variants(margins):
        for strategy, seed in plan:
            if name.endswith("+ trust") and strategy != "search":
                continue  # only the search has memory proofs
            guide = policy(options, predictions, budget_gb, space.names) if options else None
            runs.append((name, replay_strategy(space, grid, strategy, budgets[strategy],
                                               seed, within, prediction=guide)))
    return runs


def _ranks(xs: Sequence[float]) -> List[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _spearman(xs: Sequence[float], ys: Sequence[float]) -> Optional[float]:
    if len(xs) < 3:
        return None
    try:
        return statistics.correlation(_ranks(xs), _ranks(ys))
    except statistics.StatisticsError:  # constant input
        return None


def quality(space, grid: Dict[str, dict], predictions: Predictions, budget_gb: float,
            margins: Sequence[float], measured_memory: Dict[str, float]) -> str:
    """How the predictions compare with the grid's measurements (module docstring)."""
    keys = [key_of(c) for c in space.candidates()]
    ok = [k for k in keys if grid.get(k, {}).get("status") == "ok" and predictions[k].usable]
    errors = [predictions[k].memory_gb / measured_memory[k] - 1 for k in keys
              if measured_memory.get(k) and predictions[k].usable]
    rho = _spearman([grid[k]["throughput"] for k in ok], [predictions[k].samples_per_s
                                                          for k in ok])
    measured_ok = [k for k in keys if grid.get(k, {}).get("status") == "ok"]
    optimum = max(measured_ok, key=lambda k: grid[k]["throughput"]) if measured_ok else None
    lines = [f"predictions: {len(keys)} candidates; measured ok {len(ok)}, oom "
             f"{sum(grid.get(k, {}).get('status') == 'oom' for k in keys)}",
             f"memory (predicted / measured peak per rank - 1, {len(errors)} candidates with "
             "a measured peak): " + (
                 f"median {statistics.median(errors):+.1%}, range {min(errors):+.1%} to "
                 f"{max(errors):+.1%}" if errors else "no measured memory"),
             "throughput rank correlation (Spearman, ok candidates): "
             + (f"{rho:.2f}" if rho is not None else "n/a"),
             "", "| margin | pruned | measured OOMs pruned | measured OOMs run | ok but pruned "
             "| optimum pruned |", "|---:|---:|---:|---:|---:|---|"]
    for m in margins:
        rule = policy(dict(prune_margin=m), predictions, budget_gb, space.names)
        pruned = {k for k in keys if rule.predicted_oom(predictions[k]) is not None}
        oom = {k for k in keys if grid.get(k, {}).get("status") == "oom"}
        lines.append(f"| {m:g} | {len(pruned)} | {len(pruned & oom)} of {len(oom)} | "
                     f"{len(oom - pruned)} | {len(pruned - oom)} | "
                     f"{'yes' if optimum in pruned else 'no'} |")
    return "\n".join(lines)


def _median_range(xs: Sequence[float], fmt: str = "g") -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


def summarize(runs: Sequence[Tuple[str, SeedRun]], within: float) -> str:
    """A Markdown table: per strategy and variant, runs, evaluations run (and how many of them
    ran out of memory), pruned, optimum found, best / optimum and evaluations until within the
    margin (median and range)."""
    lines = [f"| strategy | variant | runs | evaluations run | of them OOM | pruned | optimum "
             f"found | best / optimum | evaluations until within {within:.0%} |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    groups: Dict[Tuple[str, str], List[SeedRun]] = {}
    for name, run in runs:
        groups.setdefault((run.strategy, name), []).append(run)
    for strategy in dict.fromkeys(r.strategy for _, r in runs):
        for (s, name), mine in groups.items():
            if s != strategy:
                continue
            hit = [r.to_within for r in mine if r.to_within is not None]
            found = sum(r.best_fraction >= 1 - 1e-9 for r in mine)
            lines.append(
                f"| {strategy} | {name} | {len(mine)} | "
                f"{_median_range([r.evaluations for r in mine])} | "
                f"{_median_range([r.oom for r in mine])} | "
                f"{_median_range([r.pruned for r in mine])} | {found} of {len(mine)} | "
                f"{_median_range([r.best_fraction for r in mine], '.3f')} | "
                f"{_median_range(hit) if hit else 'never'}"
                + (f" ({len(hit)} of {len(mine)})" if hit and len(hit) < len(mine) else "")
                + " |")
    return "\n".join(lines)


_BUDGET_PEAK = re.compile(r"peak ([0-9.]+) GB per rank")  # the driver's over-budget error


def _measured_memory(db: str, studies: Sequence[str]) -> Dict[str, float]:
    """Candidate key -> median measured peak memory per rank (GB) in the grid: an ok run's
    ``memory_gb``, an over-budget run's peak from its error (the driver's
    ``MemoryBudgetExceeded``: the peak that crossed the budget)."""
    from slapo.autotune.study import load_records

    seen: Dict[str, List[float]] = {}
    for study in studies:
        for r in load_records(db, study):
            found = _BUDGET_PEAK.search(r.error or "") if r.status == "oom" else None
            memory = r.memory_gb if r.status == "ok" else float(found.group(1)) if found \
                else None
            if memory:
                seen.setdefault(key_of(r.params), []).append(memory)
    return {k: statistics.median(v) for k, v in seen.items()}


def _costs(space, predictions: Predictions, db: str, study: str) -> str:
    """What predicting and measuring a candidate cost (seconds, median and total)."""
    from slapo.autotune.study import load_records

    predicted = [predictions[key_of(c)].seconds for c in space.candidates()]
    measured = [r.seconds for r in load_records(db, study) if r.evaluated and r.seconds]
    text = (f"cost: a prediction {statistics.median(predicted):.1f} s (median; "
            f"{sum(predicted):.0f} s for all {len(predicted)})")
    if measured:
        text += (f", a measurement in {study!r} {statistics.median(measured):.1f} s (median; "
                 f"{sum(measured):.0f} s for {len(measured)})")
    return text


def build_parser() -> argparse.ArgumentParser:
    from end2end.cli import HelpFormatter

    p = argparse.ArgumentParser(prog="python -m autotune.pruning", formatter_class=HelpFormatter,
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--db", required=True, help="the study database holding the grid")
    p.add_argument("--space", required=True, help="the space file (with memory_budget_gb and, "
                   "for --simulate, predict)")
    p.add_argument("--grid", action="append", default=None,
                   help="grid study name(s), repeatable (default: grid)")
    p.add_argument("--predictions", required=True, help="predictions file (JSON lines)")
    p.add_argument("--simulate", action="store_true",
                   help="first predict the candidates the file lacks (the space's predict)")
    p.add_argument("--margin", action="append", type=float, default=None,
                   help="prune margin(s), repeatable (default: 0.1)")
    p.add_argument("--seeds", type=int, default=10, help="TPE seeds 0..N-1")
    p.add_argument("--budget", type=int, default=None, help="evaluations per search/TPE run "
                   "(default: as autotune/run.sh, a third of the grid)")
    p.add_argument("--within", type=float, default=0.05, help="margin of the optimum")
    p.add_argument("--json", help="write every run to this file (JSON lines)")
    return p


def run(args: argparse.Namespace) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # one study per replay: no chatter
    ns = load_space_file(args.space)
    space, budget_gb = ns["space"], ns.get("memory_budget_gb")
    if budget_gb is None:
        raise TuneError(f"{args.space} defines no memory_budget_gb", hint="set it to the "
                        "per-rank budget the grid was measured with")
    studies = args.grid or ["grid"]
    grid = grid_outcomes(args.db, studies)
    predictions = load_predictions(args.predictions)
    if args.simulate:
        simulate_missing(ns, predictions, args.predictions)
    missing = [c for c in space.candidates() if key_of(c) not in predictions]
    if missing:
        raise TuneError(f"{len(missing)} candidate(s) have no prediction in "
                        f"{args.predictions} (e.g. {format_values(missing[0])})",
                        hint="add --simulate to predict them with the space's predict command")
    margins = args.margin or [0.1]
    n = len(space.candidates())
    budgets = {"grid": n, "search": args.budget or (n + 2) // 3, "tpe": args.budget or n // 3}
    print(quality(space, grid, predictions, budget_gb, margins,
                  _measured_memory(args.db, studies)))
    print(_costs(space, predictions, args.db, studies[0]))
    print(f"\nbudgets: grid {budgets['grid']}, search {budgets['search']}, tpe "
          f"{budgets['tpe']} (seeds 0-{args.seeds - 1}); memory budget {budget_gb:g} GB\n")
    runs = replay_all(space, grid, predictions, budget_gb, margins, args.seeds, budgets,
                      args.within)
    print(summarize(runs, args.within))
    if args.json:
        with open(args.json, "w") as fh:
            fh.writelines(json.dumps(dict(variant=name, **asdict(r))) + "\n" for name, r in runs)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    from end2end.cli import report_errors

    args = build_parser().parse_args(argv)
    return report_errors("python -m autotune.pruning", lambda: run(args), False)


if __name__ == "__main__":
    sys.exit(main())
