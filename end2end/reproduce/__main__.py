"""``python -m end2end.reproduce [--quick | --full] [--out DIR] [--steps A,B] [--list]
[--dry-run]`` (``bash scripts/reproduce.sh`` runs it after the set-up): run every figure and
table of the paper (:mod:`end2end.reproduce.plan`), resumably, then write ``DIR/index.md`` and
``DIR/index.html`` (:mod:`end2end.reproduce.page`)."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from slapo.errors import ConfigError

from end2end.cli import HelpFormatter, report_errors
from end2end.reproduce.page import write_index
from end2end.reproduce.plan import plan, step_names
from end2end.reproduce.runner import ROOT, claim_folder, load_outcomes, run_plan

PROG = "scripts/reproduce.sh"


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes as one line (``reproduce.sh: error: ... Hint: --help``), exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{PROG}: error: {message}. Hint: {PROG} --help lists the options\n")


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option documented)."""
    p = OneLineParser(
        prog=PROG, formatter_class=HelpFormatter,
        description="Every figure and table of the Slapo paper: at CPU scale (Figure 7, the "
                    "PyTorch peers, pipelines, fusions, the ablation of Figure 9, the "
                    "auto-tuning study of Figure 10, Table 4) and at the paper's scale "
                    "predicted by the simulator on its device profile (Figures 7-10 on "
                    "v100-32gb). One progress line per step with what is left; resumable "
                    "(a finished step is not run again, a sweep resumes by its results file); "
                    "ends with DIR/index.md and DIR/index.html, each figure beside the "
                    "committed one and the paper's value.",
        epilog="--quick (the default; about 15 minutes on 2 idle cores): the tiny models (2 "
               "layers) through every CPU flow in 1 round (Figure 7: quick.cfg, 2 rounds), the "
               "tuning flow on a 6-candidate space (autotune/spaces/tiny_bert.py), and one "
               "panel of each paper-scale prediction (Figure 7: GPT-2.9B; Figure 8: LLaMA-7B "
               "on 16 GPUs; Figure 9: BERT-1B; Figure 10: the batch-28 column). It shows that "
               "everything runs and draws every figure; its numbers are not the study's. "
               "--full: the committed studies' commands (docs/results/*.cmd): 3 interleaved "
               "rounds of every CPU config, the 25-candidate grid, every prediction; hours. "
               "Exit status: 0 every step ok; 1 some step failed (the page says which; run "
               "again to retry it); 2 usage error; 130 interrupted (run again to resume).")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="plan", action="store_const", const="quick",
                      help="the quick plan (see below)")
    size.add_argument("--full", dest="plan", action="store_const", const="full",
                      help="the full plan (see below)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: results/reproduce-quick or "
                        "results/reproduce-full); one plan per folder")
    p.add_argument("--steps", default=None, metavar="A,B",
                   help=f"run only these steps (of: {', '.join(step_names())}); the page "
                        "still shows every step")
    p.add_argument("--require-quiet", action="store_true",
                   help="every sweep and every measured tuning candidate waits for a quiet "
                        "machine before each run, or stops the step (python -m end2end.sweep "
                        "--require-quiet, autotune/run.sh --require-quiet; without it, rows "
                        "measured while the machine was busy are marked '!' in the tables)")
    p.add_argument("--list", action="store_true", help="print the plan's steps and exit")
    p.add_argument("--dry-run", action="store_true",
                   help="print the commands of the steps left to run and exit")
    p.add_argument("--debug", action="store_true", help="full traceback of an error")
    return p


def _selected(text: Optional[str]) -> Optional[List[str]]:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in step_names()]
    if unknown or not names:
        raise ConfigError(f"--steps {text!r}: no step named {', '.join(unknown) or '(none)'}",
                          hint=f"steps are {', '.join(step_names())}")
    return names


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the plan; returns the exit status."""
    plan_name = args.plan or "quick"
    steps = plan(plan_name)
    chosen = _selected(args.steps)
    if args.list:
        for step in steps:
            print(f"{step.name:10s} {step.title}: {step.what} (about {step.estimate_s:.0f} s)")
        return 0
    out = (args.out or ROOT / "results" / f"reproduce-{plan_name}").resolve()
    claim_folder(out, plan_name)
    to_run = [s for s in steps if chosen is None or s.name in chosen]
    start = time.monotonic()
    try:
        run_plan(to_run, out, dry_run=args.dry_run,
                 sweep_args=["--require-quiet"] if args.require_quiet else [])
    except KeyboardInterrupt:
        print(f"\ninterrupted; run the same command again to resume: {PROG} "
              f"{shlex.join(argv)}", file=sys.stderr)
        return 130
    if args.dry_run:
        return 0
    outcomes = load_outcomes(out)
    md, page = write_index(out, steps, outcomes, plan_name,
                           " ".join(["bash", PROG, *argv]), time.monotonic() - start)
    failed = [s.name for s in to_run if outcomes.get(s.name) is None
              or outcomes[s.name].status != "ok"]
    print(f"reproduce: {len(to_run) - len(failed)} of {len(to_run)} steps ok"
          + (f" ({', '.join(failed)} failed: run again to retry)" if failed else "")
          + f"; the page: {md} and {page}")
    return 1 if failed else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line; returns the exit status (see ``--help``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    return report_errors(PROG, lambda: run(args, argv), args.debug)


if __name__ == "__main__":
    sys.exit(main())
