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

Predictions (:mod:`slapo.autotune.predict`): the space file may define ``predict`` (a command
template like ``command`` that prints one JSON prediction line), ``predict_timeout`` and
``memory_budget_gb`` (the memory per rank a run may use). ``--prune-predicted-oom MARGIN`` does
not run a candidate predicted above ``memory_budget_gb x (1 + MARGIN)`` (it is stored as
``pruned``), ``--rank-by-prediction`` orders the candidates by predicted throughput,
``--trust-predicted-oom`` lets the search's memory proofs use pruned candidates, and
``--predictions FILE`` keeps the predictions (JSON lines) for later sessions.
"""

from __future__ import annotations

import argparse
import ast
import logging
import math
import os
import runpy
import sys
import time
import traceback
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ..errors import TuneError
from .space import Space
from .strategies import STRATEGIES
from .study import Record, Tuner, import_optuna, load_records
from .tune import TuneResult, tune

__all__ = ["main", "load_space_file", "format_values"]

#: Status lines (the start line, one line per evaluated candidate) go to this logger; the result
#: (summary, best candidate, ``reproduce:``, ``--list``) is printed: it is the command's output.
log = logging.getLogger("slapo.autotune")
PROG = "slapo.autotune"  # what starts an error line, as ``end2end.sweep: error: ...``


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
    p.add_argument("--prune-predicted-oom", type=float, default=None, metavar="MARGIN",
                   help="do not run a candidate whose predicted memory exceeds the space's "
                   "memory_budget_gb x (1 + MARGIN) (stored as 'pruned'; needs `predict`)")
    p.add_argument("--rank-by-prediction", action="store_true",
                   help="predict every candidate first and evaluate by predicted throughput "
                   "(grid: that order; tpe: its startup candidates; search: its first probe)")
    p.add_argument("--trust-predicted-oom", action="store_true",
                   help="search: a pruned candidate is an OOM proof for larger batches at "
                   "smaller ratios (default: it only does not fit where it was met)")
    p.add_argument("--predictions", default=None, metavar="FILE",
                   help="cache of predictions (JSON lines), read and appended")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- then the objective command with {symbol} placeholders")
    return p


def load_space_file(path: str) -> dict:
    """The namespace of a space file, with ``space`` checked to be a :class:`Space` (built by
    ``make_space()`` when the file defines that instead), ``command`` a string or a list of
    strings and ``timeout`` a positive number, if given.

    Every mistake in the file is a :class:`TuneError` whose message starts with
    ``FILE:LINE:`` (the line of the syntax error, of the statement that raised, or of the
    assignment that is wrong) and ends with a hint, so that the command line prints one line
    instead of a traceback."""
    if not Path(path).is_file():
        raise TuneError(f"{path}: the space file does not exist",
                        hint="give --space the path of a Python file that defines `space`")
    ns, tree = _run_space_file(path)
    space, made = ns.get("space"), "`space` is"
    try:
        if space is None and callable(ns.get("make_space")):
            space, made = ns["make_space"](), "make_space() returned"
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any error of the user's own code
        raise _user_code_error(exc, path) from None
    if space is None:
        raise TuneError(f"{path}: defines no `space` (a slapo.autotune.Space) or "
                        "`make_space()`",
                        hint="add e.g. `space = Space(); space.int('batch_size', 4, 32, "
                        "step=4)`")
    if not isinstance(space, Space):
        name = "make_space" if made.startswith("make") else "space"
        raise TuneError(f"{path}:{_line_of(tree, name)}: {made} {_a(space)}, "
                        "not a slapo.autotune.Space",
                        hint="from slapo.autotune import Space; space = Space() ...")
    command = ns.get("command")
    if command is not None and not (isinstance(command, str) or (
            isinstance(command, (list, tuple)) and all(isinstance(a, str) for a in command))):
        raise TuneError(f"{path}:{_line_of(tree, 'command')}: `command` is {_a(command)}, "
                        "not a string or a list of strings",
                        hint="command = ['python', 'bench.py', '--batch', '{batch_size}']")
    timeout = ns.get("timeout")
    if timeout is not None and (isinstance(timeout, bool)
                                or not isinstance(timeout, (int, float))
                                or not math.isfinite(timeout) or timeout <= 0):
        raise TuneError(f"{path}:{_line_of(tree, 'timeout')}: `timeout` is {timeout!r}, not "
                        "a positive number of seconds",
                        hint="set it to the seconds a candidate may run, e.g. `timeout = 600`")
    _check_prediction_names(ns, tree, path, space)
    ns["space"] = space
    return ns


def _check_prediction_names(ns: dict, tree: ast.Module, path: str, space: Space) -> None:
    """``predict`` a string or a list of strings whose placeholders name symbols or derived
    values of the space; ``predict_timeout`` and ``memory_budget_gb`` positive numbers."""
    from .predict import CommandPredictor

    for name in ("predict_timeout", "memory_budget_gb"):
        value = ns.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(
                value, (int, float)) or not math.isfinite(value) or value <= 0):
            raise TuneError(f"{path}:{_line_of(tree, name)}: `{name}` is {value!r}, not a "
                            "positive number", hint=f"e.g. `{name} = "
                            f"{'300' if 'timeout' in name else '1.3'}`")
    if ns.get("predict") is None:
        return
    where = f"{path}:{_line_of(tree, 'predict')}"
    predictor = CommandPredictor(ns["predict"], ns.get("predict_timeout"), where=where)
    predictor.check([*space.names, *(r.name for r in space.derived)])
    ns["predictor"] = predictor


def prediction_policy(args: argparse.Namespace, ns: dict):
    """The :class:`~slapo.autotune.predict.PredictionPolicy` the flags ask for, or None."""
    from .predict import PredictionCache, PredictionPolicy

    wanted = [flag for flag, on in (
        ("--prune-predicted-oom", args.prune_predicted_oom is not None),
        ("--rank-by-prediction", args.rank_by_prediction),
        ("--trust-predicted-oom", args.trust_predicted_oom)) if on]
    if not wanted:
        return None
    if ns.get("predictor") is None:
        raise TuneError(f"{' and '.join(wanted)} need(s) a `predict` command in {args.space}",
                        call="python -m slapo.autotune",
                        hint="predict = ['python', '-m', 'end2end.simulate.one', ..., "
                        "'--batch-size', '{batch_size}'] (it prints one JSON prediction line)")
    return PredictionPolicy(ns["predictor"], memory_budget_gb=ns.get("memory_budget_gb"),
                            prune_margin=args.prune_predicted_oom,
                            rank=args.rank_by_prediction, trust_oom=args.trust_predicted_oom,
                            cache=PredictionCache(args.predictions))


def _a(value) -> str:
    """``a list``, ``an int``: the value's type with its article."""
    name = type(value).__name__
    return ("an " if name[:1] in "aeiou" else "a ") + name


def _run_space_file(path: str) -> Tuple[dict, ast.Module]:
    """Run the file (``runpy``); its namespace and syntax tree, or a one-line TuneError."""
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
        return runpy.run_path(path), tree
    except SyntaxError as exc:  # in the file, or in a module it imports
        where = exc.filename or path
        raise TuneError(f"{where}:{exc.lineno or 1}: syntax error: {exc.msg}",
                        hint=f"fix that line (python -m py_compile {where} reports the same)"
                        ) from None
    except UnicodeDecodeError as exc:
        raise TuneError(f"{path}: not a text file ({exc.reason})",
                        hint="give the Python file that defines `space`") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any error of the user's own code
        raise _user_code_error(exc, path) from None


def _user_code_error(exc: BaseException, path: str) -> TuneError:
    """``FILE:LINE: ...`` for an exception raised by the space file's own code."""
    if isinstance(exc, TuneError):  # the Space API refused a declaration: its message and hint
        return TuneError(f"{_raised_at(exc, path)}: {one_line(exc)}")
    return TuneError(f"{_raised_at(exc, path)}: running the space file raised "
                     f"{type(exc).__name__}: {one_line(exc) or '(no message)'}",
                     hint=f"fix the file (python {path} shows the traceback)")


def one_line(exc: BaseException) -> str:
    """The error's message on one line."""
    return " ".join(str(exc).split())


def _raised_at(exc: BaseException, path: str) -> str:
    """``path:line`` of the innermost frame of ``exc``'s traceback in the space file."""
    target = os.path.abspath(path)
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__)
             if os.path.abspath(f.filename) == target]
    return f"{path}:{lines[-1]}" if lines else path


def _line_of(tree: ast.Module, *names: str) -> int:
    """The line of the last top-level assignment (or ``def``) of one of ``names``; 1 if none."""
    line = 1
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            line = node.lineno
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign))
                   else [])
        if any(isinstance(t, ast.Name) and t.id in names for t in targets):
            line = node.lineno
    return line


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
    """One status line per evaluated candidate: to ``out`` if given, else the
    ``slapo.autotune`` logger (which :func:`main` sends to stdout)."""

    def __init__(self, out=None):
        self.out, self.start = out, time.time()

    def __call__(self, record: Record, tuner: Tuner) -> None:
        best = tuner.best()
        best_text = f"best {best.throughput:.4g} ({format_values(best.params)})" if best \
            else "best -"
        per = (time.time() - self.start) / max(1, tuner.run_now)
        line = (f"[{tuner.evaluations}/{tuner.budget}] {format_values(record.params)}: "
                f"{_outcome(record)} in {record.seconds:.1f}s | {best_text} | "
                f"ETA <= {_duration(per * tuner.remaining)}")
        if self.out is None:
            log.info(line)
        else:
            print(line, file=self.out, flush=True)


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
          + (f"; {len(result.skipped)} proven OOM, not run" if result.skipped else "")
          + (f"; {len(result.pruned)} pruned by prediction, not run" if result.pruned else ""))
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


class _StatusHandler(logging.StreamHandler):
    """INFO to the current ``sys.stdout``, WARNING and above to ``sys.stderr`` (looked up per
    record, so redirection and test capture see every line)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        super().emit(record)


def configure_logging(level: int = logging.INFO) -> None:
    """Send the ``slapo.autotune`` logger's records to stdout/stderr as plain lines
    (idempotent: the handler installed before is replaced)."""
    for old in [h for h in log.handlers if isinstance(h, _StatusHandler)]:
        log.removeHandler(old)
    log.addHandler(_StatusHandler())
    log.setLevel(level)
    log.propagate = False


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging()
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
        policy = prediction_policy(args, ns)
        budget = args.budget or len(space.candidates())
        log.info(f"{args.strategy} over {len(space.candidates())} candidates "
                 f"({space.describe()}), budget {budget}")
        result = tune(space, command, strategy=args.strategy, budget=budget, db=args.db,
                      study=study, timeout=args.timeout or ns.get("timeout"),
                      on_record=Progress(), prediction=policy, **options)
    except TuneError as exc:
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr, flush=True)
        return 2
    return _report(result)
