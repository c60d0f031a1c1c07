"""Strategies over seeds on one measured grid: ``python -m autotune.seeds --db DB --space FILE``.

A claim about a search strategy must hold over seeds, not one lucky run. This replays each
strategy on the grid's measurements (the ground truth of ``bash autotune/run.sh``; several grid
studies, ``--grid grid --grid grid-2``, are combined per candidate as the median throughput, an
``oom`` in any of them counting as ``oom``), in memory, nothing measured: the original's
OOM-aware search once (it is deterministic), TPE once per seed. For each run it reports how many
evaluations it took to come within ``--within`` (default 5 %) of the grid's optimum and the best
it found within ``--budget`` as a fraction of the optimum; then per strategy the median and range
over the seeds, and how many runs got there at all. ``--json FILE`` keeps every run.

    python -m autotune.seeds --db results/autotune-bert.db --space autotune/spaces/bert.py \\
        --seeds 10 --budget 8
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Dict, Optional, Sequence

from slapo.autotune import tune
from slapo.autotune.cli import load_space_file
from slapo.autotune.study import key_of

from end2end.results.tuning import SeedRun, grid_outcomes, summarize

__all__ = ["replay_strategy", "add_replay_options", "main"]


def replay_strategy(space, grid: Dict[str, dict], strategy: str, budget: int, seed: int,
                    within: float, prediction=None) -> SeedRun:
    """Run ``strategy`` in memory, answered from ``grid``; ``prediction``: a
    :class:`~slapo.autotune.PredictionPolicy` that prunes and/or ranks (autotune.pruning)."""
    optimum = max(o["throughput"] for o in grid.values() if o["status"] == "ok")
    names = list(space.names)

    def objective(values):
        key = key_of({n: values[n] for n in names})
        return grid.get(key, {"status": "fail", "error": "not measured in the grid"})

    options = {"seed": seed} if strategy == "tpe" else {}
    result = tune(space, objective, strategy=strategy, budget=budget, prediction=prediction,
                  **options)
    done = [r for r in result.evaluated if r.evaluated]
    best, to_within = 0.0, None
    for i, r in enumerate(done, start=1):
        if r.status == "ok":
            best = max(best, r.throughput)
            if to_within is None and best >= (1 - within) * optimum:
                to_within = i
    return SeedRun(strategy, seed, len(done), to_within, best / optimum, len(result.pruned),
                   sum(r.status == "oom" for r in done))


def build_parser() -> argparse.ArgumentParser:
    from end2end.cli import HelpFormatter

    p = argparse.ArgumentParser(prog="python -m autotune.seeds", formatter_class=HelpFormatter,
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--db", required=True, help="the study database holding the grid")
    p.add_argument("--space", required=True, help="the space file the grid was measured on")
    p.add_argument("--grid", action="append", default=None,
                   help="grid study name(s), repeatable (default: grid)")
    add_replay_options(p, budget=8)
    return p


def add_replay_options(p: argparse.ArgumentParser, budget: int) -> None:
    """The options of a replay of the strategies on a known grid (this module's and
    :mod:`autotune.predicted_grid`'s): ``--seeds``, ``--budget``, ``--within``, ``--json``,
    ``--debug``."""
    p.add_argument("--seeds", type=int, default=10, help="TPE seeds 0..N-1")
    p.add_argument("--budget", type=int, default=budget, help="evaluations per strategy run")
    p.add_argument("--within", type=float, default=0.05, help="margin of the optimum")
    p.add_argument("--json", help="write every strategy run to this file (JSON lines)")
    p.add_argument("--debug", action="store_true", help="full traceback of an error")


def main(argv: Optional[Sequence[str]] = None) -> int:
    from end2end.cli import report_errors

    args = build_parser().parse_args(argv)

    def run() -> int:
        space = load_space_file(args.space)["space"]
        grid = grid_outcomes(args.db, args.grid or ["grid"])
        runs = [replay_strategy(space, grid, "search", args.budget, 0, args.within)]
        runs += [replay_strategy(space, grid, "tpe", args.budget, seed, args.within)
                 for seed in range(args.seeds)]
        print(summarize(runs, args.within))
        if args.json:
            with open(args.json, "w") as fh:
                fh.writelines(json.dumps(asdict(r)) + "\n" for r in runs)
        return 0

    return report_errors("python -m autotune.seeds", run, args.debug)


if __name__ == "__main__":
    sys.exit(main())
