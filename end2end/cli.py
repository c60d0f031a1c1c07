"""What every ``python -m end2end.*`` command line shares: help that shows defaults, numbers
checked at the edge, and user errors as one line instead of a traceback.

* :class:`HelpFormatter` appends ``(default: X)`` to every option that has a real default
  (not for ``None``, flags or required arguments).
* :func:`number` is an ``argparse`` type for ints/floats with bounds, so ``--steps -1`` or
  ``--timeout nan`` stop at the command line (exit 2, nothing runs, no row) instead of
  producing a row with negative throughput or a sweep where every run "times out".
* :func:`report_errors` turns a :class:`~slapo.errors.SlapoError` (config, usage, results file)
  into ``prog: error: file:line: what. Hint: ...`` and exit status 2; ``--debug`` re-raises.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Callable, Optional

from slapo.errors import SlapoError

__all__ = ["HelpFormatter", "number", "report_errors", "one_line", "add_workload_arguments"]


class HelpFormatter(argparse.HelpFormatter):
    """``(default: X)`` after every option with a real default."""

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
    p.add_argument("--model", required=True, help="a zoo name (python -m end2end.models)")
    p.add_argument("--seq-len", type=number(int, minimum=1), required=True,
                   help="encoder sequence length (WideResNet: 1)")
    p.add_argument("--dec-seq-len", type=number(int, minimum=0), default=0,
                   help="decoder sequence length (T5 only)")
    p.add_argument("--batch-size", type=number(int, minimum=1), required=True,
                   help="global batch (all ranks together)")
