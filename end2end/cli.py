"""What every ``python -m end2end.*`` command line shares: help that shows defaults, numbers
checked at the edge, and user errors as one line instead of a traceback.

* :class:`HelpFormatter` appends ``(default: X)`` to every option that has a real default
  (not for ``None``, flags or required arguments).
* :func:`number` is an ``argparse`` type for ints/floats with bounds, so ``--steps -1`` or
  ``--timeout nan`` stop at the command line (exit 2, nothing runs, no row) instead of
  producing a row with negative throughput or a sweep where every run "times out".
* :func:`report_errors` turns a :class:`~slapo.errors.SlapoError` (config, usage, results file)
  into ``prog: error: file:line: what. Hint: ...`` and exit status 2; ``--debug`` re-raises.
* :func:`get_logger` / :func:`configure_logging`: status and diagnostics go through Python
  ``logging`` (see "Logging" below); what a command prints *as its interface* (tables, listings,
  commands of ``--dry-run``, JSON lines another program reads) stays ``print`` to stdout.

Logging
-------
``log = get_logger("end2end.sweep")`` (the logger is named after the command) and then
``log.info("...")`` for status, ``log.warning("warning: ...")`` / ``log.error(...)`` for
diagnostics. Every record is written as ``%(name)s: %(message)s``, e.g.
``end2end.bench: fail: rank 1: ...``: the logger adds no level word, so a message says
``warning:`` itself where it wants one and tests can match the text. Records below WARNING go to
stdout (where the ``print`` calls they replace went), WARNING and above to stderr; both streams
are looked up when a record is written, so redirection and pytest's capture see them.

Only rank 0 speaks: :class:`RankZeroFilter` drops a record below WARNING when the environment
says this process is another rank (``RANK`` set and not ``"0"``; torchrun sets it), so N ranks
print one status line, not N. Warnings and errors always pass, and so does a record logged with
``extra=ALL_RANKS`` (``log.info("rank %d: ...", rank, extra=ALL_RANKS)``).

The handler sits on the harness's top-level loggers (:data:`LOGGER_NAMESPACES`), not on the root
logger, with ``propagate`` off: other libraries' logging (torch, DeepSpeed, Optuna) is left as it
was and nothing prints twice. :func:`get_logger` installs this setup at level INFO on first use,
so the harness's functions called from Python (tests, notebooks) show the same lines as the
command; a command's ``main`` calls :func:`configure_logging` (``--log-level`` from
:func:`add_logging_arguments`) to change the level.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import textwrap
from typing import Callable, Optional, Sequence, Union

from slapo.errors import SlapoError

__all__ = ["HelpFormatter", "number", "report_errors", "one_line", "add_workload_arguments",
           "get_logger", "configure_logging", "add_logging_arguments", "RankZeroFilter",
           "ALL_RANKS", "LOG_FORMAT", "LOGGER_NAMESPACES", "LOG_LEVELS", "is_rank_zero"]


class HelpFormatter(argparse.HelpFormatter):
    """``(default: X)`` after every option with a real default; a word longer than the line (a
    default path) stays whole on a line of its own, so it can be copied."""

    def _split_lines(self, text: str, width: int) -> list:
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("%(default)" in text or action.default is None or action.nargs == 0
                or action.default in (argparse.SUPPRESS, []) or action.required
                or not action.option_strings):
            return text
        return text + " (default: %(default)s)"


def number(kind: type = int, minimum: Optional[float] = None, above: Optional[float] = None
           ) -> Callable[[str], float]:
    """An argparse type: ``kind(text)``, finite, ``>= minimum`` and/or ``> above``."""
    bound = (f">= {minimum:g}" if minimum is not None else "") + \
            (f"> {above:g}" if above is not None else "")

    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if (not math.isfinite(value) or (minimum is not None and value < minimum)
                or (above is not None and value <= above)):
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number {bound}")
        return value

    convert.__name__ = kind.__name__  # argparse names the type in its messages
    return convert


def one_line(exc: BaseException) -> str:
    """The error's message on one line."""
    return " ".join(str(exc).split())


def report_errors(prog: str, run: Callable[[], int], debug: bool) -> int:
    """``run()``; a SlapoError becomes one line on stderr and exit status 2 (unless ``debug``)."""
    try:
        return run()
    except SlapoError as exc:
        if debug:
            raise
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr, flush=True)
        return 2


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """``--model``, ``--seq-len``, ``--dec-seq-len`` and ``--batch-size``: what a run trains
    (the driver's and ``end2end.ab``'s command lines)."""
    p.add_argument("--model", required=True,
                   help="a zoo name (python -m end2end.models), a shape FAMILY:key=value,... "
                        "or the path of an HF config.json")
    p.add_argument("--seq-len", type=number(int, minimum=1), required=True,
                   help="encoder sequence length (WideResNet: 1)")
    p.add_argument("--dec-seq-len", type=number(int, minimum=0), default=0,
                   help="decoder sequence length (T5 only)")
    p.add_argument("--batch-size", type=number(int, minimum=1), required=True,
                   help="global batch (all ranks together)")


# --- logging: status and diagnostics (see the module docstring) --------------------------------

#: ``extra=ALL_RANKS`` lets a record below WARNING through on every rank.
ALL_RANKS = {"all_ranks": True}
#: What every record looks like: ``end2end.sweep: c.cfg: 3 runs, ...``.
LOG_FORMAT = "%(name)s: %(message)s"
#: The top-level loggers that get the handler (the harness and the study suites).
LOGGER_NAMESPACES: Sequence[str] = ("end2end", "ablation", "autotune", "usability")
#: ``--log-level`` choices.
LOG_LEVELS = ("debug", "info", "warning", "error")

_HANDLER_NAME = "end2end.cli"  # marks the handler configure_logging installs (idempotent)


def is_rank_zero() -> bool:
    """True unless the environment names another rank (``RANK`` set and not ``0``)."""
    return os.environ.get("RANK", "0").strip() in ("", "0")


class RankZeroFilter(logging.Filter):
    """Pass a record on rank 0; on other ranks only warnings, errors and ``extra=ALL_RANKS``.

    The rank is read from the environment for every record, so a process whose ``RANK`` is set
    after logging was configured is still filtered right."""

    def filter(self, record: logging.LogRecord) -> bool:
        return (record.levelno >= logging.WARNING or getattr(record, "all_ranks", False)
                or is_rank_zero())


class _SplitStreamHandler(logging.StreamHandler):
    """INFO and below to the current ``sys.stdout``, WARNING and above to ``sys.stderr``."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # looked up per record: redirection and capture see every line
        return sys.stderr if self._to_stderr else sys.stdout

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; the property decides
        pass

    def emit(self, record: logging.LogRecord) -> None:
        self._to_stderr = record.levelno >= logging.WARNING
        if not self._to_stderr:
            sys.stderr.flush()  # keep the two streams in order on a terminal
        super().emit(record)  # StreamHandler.emit flushes

    _to_stderr = False


def _level(level: Union[int, str]) -> int:
    if isinstance(level, str):
        value = logging.getLevelName(level.upper())
        if not isinstance(value, int):
            raise ValueError(f"unknown log level {level!r}; use one of {', '.join(LOG_LEVELS)}")
        return value
    return int(level)


def configure_logging(level: Union[int, str] = logging.INFO,
                      namespaces: Sequence[str] = LOGGER_NAMESPACES) -> None:
    """Install the harness's handler (format :data:`LOG_FORMAT`, :class:`RankZeroFilter`,
    stdout/stderr split) on ``namespaces`` at ``level`` ("info", "debug", or a logging level).

    Idempotent: calling it again replaces the handler it installed before, so a command's
    ``main`` may call it every time it runs (tests call ``main`` many times in one process)."""
    value = _level(level)
    for name in namespaces:
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
            logger.removeHandler(old)
        handler = _SplitStreamHandler()
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        handler.addFilter(RankZeroFilter())
        logger.addHandler(handler)
        logger.setLevel(value)
        logger.propagate = False


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)``, with the harness's setup installed (level INFO) if no
    command has configured logging yet. Name it after the command: ``"end2end.sweep"``."""
    top = name.split(".")[0]
    root = logging.getLogger(top)
    if not any(h.get_name() == _HANDLER_NAME for h in root.handlers):
        configure_logging(namespaces=(top,))
    return logging.getLogger(name)


def add_logging_arguments(p: argparse.ArgumentParser) -> None:
    """``--log-level``: how much status the command prints (pass it to configure_logging)."""
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                   help="status lines to print: debug adds detail, warning keeps only problems")
