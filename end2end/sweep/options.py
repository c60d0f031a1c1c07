"""The command-line options every sweep shares (``python -m end2end.sweep`` and the Figure 8
launcher): where the rows go, how long a run may take, rounds, retries, waiting for another
sweep, a dry run, tracebacks and logging. Each sweep adds its own options beside them."""

from __future__ import annotations

import argparse

from end2end.cli import add_logging_arguments, number

__all__ = ["add_sweep_options", "add_quiet_options"]


def add_sweep_options(p: argparse.ArgumentParser, results: str, beside: str) -> None:
    """Add the shared options to ``p``: ``--results`` (default ``results``; ``beside`` says what
    goes next to it), ``--timeout``, ``--repeat``, ``--retry-failed``, ``--wait``,
    ``--dry-run``, ``--debug`` and the logging options."""
    p.add_argument("--results", default=results,
                   help=f"results TSV to append to ({beside})")
    p.add_argument("--timeout", type=number(float, above=0), default=1800.0,
                   help="seconds per run for the whole job, start-up included (a finite number "
                        "> 0); on expiry every process of the run is stopped and it gets a "
                        "timeout row")
    p.add_argument("--repeat", type=number(int, minimum=1), default=1,
                   help="interleaved rounds: every run once, then every run again ...; each row "
                   "records its round (column Repeat), resume continues within a round")
    p.add_argument("--retry-failed", action="store_true",
                   help="re-run runs whose row is fail or timeout (a skipped run is tried "
                        "again anyway, once there are devices enough for it)")
    p.add_argument("--wait", action="store_true",
                   help="if another sweep uses the results file, wait for it instead of "
                        "refusing")
    p.add_argument("--dry-run", action="store_true",
                   help="print the commands of the pending runs and exit")
    p.add_argument("--debug", action="store_true",
                   help="show the full traceback of an error (otherwise one line)")
    add_logging_arguments(p)


def add_quiet_options(p: argparse.ArgumentParser, where: str = "") -> None:
    """Add ``--require-quiet`` and ``--quiet-wait`` (:mod:`end2end.sweep.quiet`) to ``p``;
    ``where`` says which machine is watched, when that needs saying."""
    p.add_argument("--require-quiet", action="store_true",
                   help=f"before each run, wait for a quiet machine{where} (others using at "
                        "most 10%% of the cores, steal at most 5%%, no other busy process: "
                        "end2end/sweep/quiet.py); refuse in one line (exit 2) when it stays "
                        "busy for --quiet-wait seconds. Without it, every row still says in "
                        "its Machine column whether the machine was quiet")
    p.add_argument("--quiet-wait", type=number(float, minimum=0), default=300.0,
                   help="seconds --require-quiet waits for a quiet machine before refusing")
