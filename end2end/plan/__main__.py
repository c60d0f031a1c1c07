"""``python -m end2end.plan MODEL --cluster PROFILE:GPUSxNODES``: the best Slapo schedule and
layout for a model on a cluster, predicted by the simulator (docs/planning.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from end2end.cli import HelpFormatter, get_logger, number, report_errors

__all__ = ["build_parser", "main"]

log = get_logger("end2end.plan")


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option documented)."""
    from end2end.plan.predict import REDUCE_ABOVE
    from end2end.plan.search import DEFAULT_CACHE

    p = argparse.ArgumentParser(
        prog="python -m end2end.plan", formatter_class=HelpFormatter,
        description="Search modes, TP x PP x DP layouts, micro-batches and checkpointing for "
                    "MODEL on a cluster; simulate the most promising and print them ranked, "
                    "with the best as a config line and a launch command.",
        epilog="Predictions, not measurements (docs/simulate.md says how far the simulator is "
               "validated). Exit status: 0 done; 2 a usage error (one line on stderr: an "
               "unknown profile, a cluster spec that does not parse, a model that fits nowhere).")
    p.add_argument("model", help="a zoo name, a shape FAMILY:key=value,... or an HF config.json")
    p.add_argument("--cluster", required=True,
                   help="PROFILE:GPUSxNODES, e.g. h100-80gb:8x4 (profiles: docs/simulate.md)")
    p.add_argument("--seq", type=number(int, minimum=1), default=2048, help="sequence length")
    p.add_argument("--dec-seq", type=number(int, minimum=0), default=0,
                   help="decoder sequence length (T5 only)")
    p.add_argument("--global-batch", type=number(int, minimum=1), default=None,
                   help="samples per step, all devices together (default: 4 per device)")
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default=None,
                   help="the training dtype (default: bf16 where the device has it, fp16 on "
                        "V100, fp32 on cpu)")
    p.add_argument("--budget", type=number(float, above=0), default=12.0,
                   help="minutes of simulation; no candidate starts that would overrun it")
    p.add_argument("--max-candidates", type=number(int, minimum=1), default=None,
                   help="simulate at most this many candidates")
    p.add_argument("--jobs", type=number(int, minimum=1), default=2,
                   help="simulations at a time (one process each)")
    p.add_argument("--top", type=number(int, minimum=1), default=10, help="rows of the table")
    p.add_argument("--json", metavar="FILE", default=None,
                   help="write every simulated candidate, best first, one JSON object a line")
    p.add_argument("--explain", type=number(int, minimum=1), action="append", default=[],
                   metavar="N", help="show candidate N of the table in full (repeatable)")
    p.add_argument("--cache", default=str(DEFAULT_CACHE),
                   help="folder of cached simulations ('' for none)")
    p.add_argument("--calibration", default="",
                   help="the cpu profile's measurement file (cluster cpu:...)")
    p.add_argument("--timeout", type=number(float, above=0), default=600,
                   help="seconds one simulation may take")
    p.add_argument("--reduce-above", type=number(int, minimum=0), default=REDUCE_ABOVE,
                   metavar="L",
                   help="simulate candidates with more than L layers per pipeline stage at "
                        "reduced depth (2 and 4 layers, extrapolated); 0: every candidate "
                        "deeper than 4")
    p.add_argument("--check", type=number(int, minimum=0), default=0, metavar="N",
                   help="simulate the first N extrapolated candidates at full depth too and "
                        "print the extrapolation's error (minutes each at paper scale)")
    p.add_argument("--debug", action="store_true", help="raise errors with their traceback")
    return p


def run(args: argparse.Namespace) -> int:
    """Plan and print (see :func:`build_parser`)."""
    from end2end.plan.cluster import parse_cluster
    from end2end.plan.report import (best_lines, explain_lines, json_text, summary_lines,
                                     table_lines)
    from end2end.plan.search import SearchOptions, plan

    cluster = parse_cluster(args.cluster, args.calibration or None)
    options = SearchOptions(args.budget * 60, args.jobs, args.max_candidates,
                            Path(args.cache) if args.cache else None, args.timeout,
                            progress=log.info, reduce_above=args.reduce_above)
    result = plan(args.model, cluster, args.seq, args.global_batch, args.dtype, args.dec_seq,
                  options)
    lines = summary_lines(result) + [""] + table_lines(result, args.top) + [""] + \
        best_lines(result)
    for n in args.explain:
        lines += [""] + explain_lines(result, n)
    print("\n".join(lines), flush=True)
    if args.check:
        from end2end.plan.check import check_extrapolation, check_lines

        print("\n" + "\n".join(check_lines(check_extrapolation(result, args.check, options))),
              flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json_text(result))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; the exit status."""
    args = build_parser().parse_args(argv)
    return report_errors("end2end.plan", lambda: run(args), args.debug)


if __name__ == "__main__":
    sys.exit(main())
