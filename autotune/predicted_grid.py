"""A whole tuning grid predicted, and the strategies replayed on it: ``python -m
autotune.predicted_grid --space FILE --predictions FILE [--simulate] [--json FILE]``.

Without a GPU the paper-scale Figure 10 (``autotune/spaces/bert_paper.py``) can only be
predicted. ``--simulate`` predicts every candidate the predictions file lacks with the space's
``predict`` command (:func:`autotune.pruning.simulate_missing`: one ``end2end.simulate.one`` run
each, appended to the file, so an interrupted run resumes). The predictions then stand in for
the grid's measurements (:func:`end2end.results.tuning.predicted_outcomes`: ``sim`` is a run at
the predicted samples/s, ``sim-oom`` an out-of-memory run, ``fail``/``timeout`` a failed one)
and the tuner's strategies are replayed on them in memory
(:func:`autotune.seeds.replay_strategy`): the OOM-aware search once, TPE once per seed. Printed:
the predicted optimum and OOM candidates, then per strategy whether it reached the predicted
optimum and after how many evaluations; ``--json FILE`` keeps the runs (the ``grid-predicted``
report kind draws them). ``--batches 10,14,18`` keeps only those batch sizes of the space (a
constraint on ``batch_size``: a smaller grid when predicting all of it costs too long; the
replay searches that smaller grid).

This says whether the search finds the optimum *of the prediction*; whether the prediction's
optimum is the GPU's is for a GPU to say.

    python -m autotune.predicted_grid --space autotune/spaces/bert_paper.py \\
        --predictions results/autotune-bert-paper.v100-32gb.predictions.jsonl --simulate
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Dict, List, Optional, Sequence

from slapo.autotune.cli import format_values, load_space_file
from slapo.autotune.study import key_of
from slapo.errors import TuneError

from end2end.results.tuning import (SeedRun, load_predictions, predicted_optimum,
                                    predicted_outcomes, summarize)

from autotune.pruning import simulate_missing
from autotune.seeds import add_replay_options, replay_strategy

__all__ = ["keep_batches", "replay", "main"]


def replay(space, outcomes: Dict[str, dict], budget: int, seeds: int, within: float
           ) -> List[SeedRun]:
    """The search once and TPE once per seed, answered from the predicted ``outcomes``."""
    missing = [c for c in space.candidates() if key_of(c) not in outcomes]
    if missing:
        raise TuneError(f"{len(missing)} candidate(s) have no prediction, e.g. "
                        f"{format_values(missing[0])}", call="autotune.predicted_grid",
                        hint="predict them first: add --simulate")
    runs = [replay_strategy(space, outcomes, "search", budget, 0, within)]
    runs += [replay_strategy(space, outcomes, "tpe", budget, s, within) for s in range(seeds)]
    return runs


def keep_batches(space, text: str) -> None:
    """Constrain ``space`` to the batch sizes listed in ``text`` (``"10,14,18"``)."""
    try:
        batches = {int(b) for b in text.split(",")}
    except ValueError:
        raise TuneError(f"--batches {text!r} is not a comma-separated list of integers",
                        call="autotune.predicted_grid", hint="e.g. --batches 10,14,18") from None
    known = space.symbols.get("batch_size")
    unknown = sorted(batches - set(known.values)) if known else sorted(batches)
    if unknown:
        raise TuneError(f"--batches: {unknown} not batch sizes of the space",
                        call="autotune.predicted_grid",
                        hint=f"batch_size is one of {list(known.values) if known else '(none)'}")
    space.constrain(lambda c: c["batch_size"] in batches,
                    f"batch_size in {{{', '.join(map(str, sorted(batches)))}}}")


def build_parser() -> argparse.ArgumentParser:
    from end2end.cli import HelpFormatter

    p = argparse.ArgumentParser(prog="python -m autotune.predicted_grid",
                                formatter_class=HelpFormatter,
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--space", required=True, help="the space file (with a `predict` command)")
    p.add_argument("--predictions", required=True,
                   help="predictions, JSON lines (read, and appended by --simulate)")
    p.add_argument("--simulate", action="store_true",
                   help="first predict the candidates the file lacks (minutes each on a CPU)")
    p.add_argument("--batches", default=None, metavar="B,B,...",
                   help="keep only these batch sizes of the space (default: all)")
    add_replay_options(p, budget=16)
    return p


def _run(args: argparse.Namespace) -> int:
    ns = load_space_file(args.space)
    space = ns["space"]
    if args.batches:
        keep_batches(space, args.batches)
    predictions = load_predictions(args.predictions)
    if args.simulate:
        simulate_missing(ns, predictions, args.predictions, log=lambda m: print(m, flush=True))
    wanted = {key_of(c) for c in space.candidates()}  # --batches: only the kept ones
    outcomes = {k: o for k, o in predicted_outcomes(predictions).items() if k in wanted}
    key, best = predicted_optimum(outcomes)
    oom = sorted(format_values(json.loads(k)) for k, o in outcomes.items()
                 if o["status"] == "oom")
    print(f"predicted optimum: {best['throughput']:.3g} samples/s at "
          f"{format_values(json.loads(key))}; predicted OOM: {len(oom)} of {len(outcomes)}"
          + (f" ({'; '.join(oom)})" if oom else ""))
    runs = replay(space, outcomes, args.budget, args.seeds, args.within)
    print(summarize(runs, args.within))
    if args.json:
        with open(args.json, "w") as fh:
            fh.writelines(json.dumps(asdict(r)) + "\n" for r in runs)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    from end2end.cli import report_errors

    args = build_parser().parse_args(argv)
    return report_errors("python -m autotune.predicted_grid", lambda: _run(args), args.debug)


if __name__ == "__main__":
    sys.exit(main())
