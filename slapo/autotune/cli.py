"""``python -m slapo.autotune``: tune a command's knobs over a space declared in a Python file.

::

    python -m slapo.autotune --space SPACE.py --strategy grid|search|tpe --budget N \\
        --db STUDY.db [--study NAME] [--timeout S] -- COMMAND ARG {symbol} ...

``SPACE.py`` defines ``space`` (a :class:`~slapo.autotune.Space`) or ``make_space()``, and may
define ``command`` (the objective command when none follows ``--``) and ``timeout``. Each
candidate runs ``COMMAND`` with ``{name}`` replaced by its values (see
:class:`~slapo.autotune.CommandObjective` for the JSON result it must print). One progress line
per candidate (the best so far and an upper bound of the time left: the mean time per candidate
times the budget left); at the end the best candidate and the command line that reproduces it
(and its config line when the command reports one). Re-running the same command resumes the
study; ``--list`` prints what the study holds. Exit status: 0 with a best candidate, 1 when none
ran ok, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import runpy
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from ..errors import TuneError
from .space import Space
from .strategies import STRATEGIES
from .study import Record, Tuner, import_optuna, load_records
from .tune import TuneResult, tune

__all__ = ["main", "load_space_file", "format_values"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m slapo.autotune",
        description="Tune the knobs of a command over a search space; every candidate is "
                    "stored in an Optuna study (SQLite), so a re-run resumes.",
        epilog="Example: python -m slapo.autotune --space space.py --strategy search --budget "
               "20 --db s.db -- python bench.py --batch {batch_size} --ckpt {ckpt_ratio}")
    p.add_argument("--space", required=True, help="Python file defining `space` or "
                   "`make_space()` (and optionally `command`, `timeout`)")
    p.add_argument("--strategy", choices=tuple(STRATEGIES), default="search",
                   help="grid: every candidate; search: the original OOM-aware search over "
                   "batch size x checkpoint ratio; tpe: Optuna's TPE (default: search)")
    p.add_argument("--budget", type=int, default=None,
                   help="candidates to evaluate in the study, all runs together (default: "
                   "the number of valid candidates)")
    p.add_argument("--db", default=None, help="study database (SQLite file); default: in "
                   "memory, not resumable")
    p.add_argument("--study", default=None, help="study name in the database (default: the "
                   "strategy)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per candidate before it is killed (a timeout outcome)")
    p.add_argument("--seed", type=int, default=0, help="TPE's seed")
    p.add_argument("--batch-symbol", default="batch_size", help="search: the batch symbol")
    p.add_argument("--ratio-symbol", default="ckpt_ratio", help="search: the ratio symbol")
    p.add_argument("--patience", type=int, default=5, help="search: stop after this many "
                   "evaluations in a row that ran without improving")
    p.add_argument("--list", action="store_true", help="print the study's stored candidates "
                   "and exit")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- then the objective command with {symbol} placeholders")
    return p


def load_space_file(path: str) -> dict:
    """The namespace of a space file, with ``space`` checked to be a :class:`Space`."""
    if not Path(path).is_file():
        raise TuneError(f"space file {path!r} does not exist", call="--space")
    ns = runpy.run_path(path)
    space = ns.get("space")
    if space is None and callable(ns.get("make_space")):
        space = ns["make_space"]()
    if not isinstance(space, Space):
        raise TuneError(f"{path} defines no `space` (a slapo.autotune.Space) or `make_space()`",
                        call="--space", hint="space = Space(); space.int('batch_size', 4, 32, "
                        "step=4) ...")
    ns["space"] = space
    return ns


def format_values(params: dict) -> str:
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in params.items())


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _outcome(r: Record) -> str:
    if r.status != "ok":
        return f"{r.status} ({r.error[:80]})" if r.error else r.status
    mem = f", {r.memory_gb:.3g} GB" if r.memory_gb is not None else ""
    return f"ok {r.throughput:.4g}{mem}"


class Progress:
    """Prints one line per evaluated candidate."""

    def __init__(self, out=sys.stdout):
        self.out, self.start = out, time.time()

    def __call__(self, record: Record, tuner: Tuner) -> None:
        best = tuner.best()
        best_text = f"best {best.throughput:.4g} ({format_values(best.params)})" if best \
            else "best -"
        per = (time.time() - self.start) / max(1, tuner.run_now)
        print(f"[{tuner.evaluations}/{tuner.budget}] {format_values(record.params)}: "
              f"{_outcome(record)} in {record.seconds:.1f}s | {best_text} | "
              f"ETA <= {_duration(per * tuner.remaining)}", file=self.out, flush=True)


def _print_list(records: List[Record]) -> None:
    for r in records:
        print(f"#{r.number:<4} {r.status:<11} {format_values(r.params)}: {_outcome(r)}")


def _report(result: TuneResult) -> int:
    counts: dict = {}
    for r in result.evaluated:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    where = f" in {result.db}" if result.db else ""
    print(f"study {result.study!r}{where}: {len(result.evaluated)} evaluated ({summary}), "
          f"{result.run_now} run now; stopped: {result.stopped}"
          + (f"; {len(result.skipped)} proven OOM, not run" if result.skipped else ""))
    best = result.best
    if best is None:
        print("no candidate ran ok")
        return 1
    print(f"best: {format_values(best.params)} -> {best.throughput:.4g}"
          + (f", {best.memory_gb:.3g} GB" if best.memory_gb is not None else "")
          + f" (trial {best.number})")
    print(f"reproduce: {result.command}")
    if best.extra.get("config_line"):
        print("config line: " + str(best.extra["config_line"]).replace("\n", "\n  "))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    try:
        optuna = import_optuna()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        ns = load_space_file(args.space)
        space: Space = ns["space"]
        study = args.study or args.strategy
        if args.list:
            if not args.db:
                raise TuneError("--list needs --db", call="python -m slapo.autotune")
            _print_list(load_records(args.db, study))
            return 0
        command = command or ns.get("command") or []
        if not command:
            raise TuneError("no objective command", call="python -m slapo.autotune",
                            hint="give it after '--', or define `command` in the space file")
        options = {"search": dict(batch=args.batch_symbol, ratio=args.ratio_symbol,
                                  patience=args.patience),
                   "tpe": dict(seed=args.seed)}.get(args.strategy, {})
        budget = args.budget or len(space.candidates())
        print(f"{args.strategy} over {len(space.candidates())} candidates "
              f"({space.describe()}), budget {budget}", flush=True)
        result = tune(space, command, strategy=args.strategy, budget=budget, db=args.db,
                      study=study, timeout=args.timeout or ns.get("timeout"),
                      on_record=Progress(), **options)
    except TuneError as exc:
        print(f"python -m slapo.autotune: error: {exc}", file=sys.stderr)
        return 2
    return _report(result)
