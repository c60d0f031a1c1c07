"""``python -m end2end.plan.cpu_study MODEL --out DIR``: the planner measured for real on this
CPU (issue 40, item 4; docs/planning.md, "On this CPU, measured").

1. MODEL is planned (simulation only, :func:`end2end.plan.plan`) on ``--cluster cpu:Rx1`` with
   the ``cpu`` profile of ``--calibration FILE``, for each ``--global-batch``, within the
   ``--modes``, ``--ckpt``, ``--tp``, ``--pp``, ``--accumulation`` and ``--knobs`` given
   (:class:`end2end.plan.limits.SpaceLimits`; ``--knobs`` defaults to the recipes' defaults,
   as the committed studies ran) and the per-rank memory cap ``--memory-gb`` (a
   prediction above it is ``sim-oom``); the rankings are merged (predicted to fit first, by
   predicted samples/s) into ``DIR/planned.jsonl``, and the ``--top`` best predicted to fit are
   the planner's picks.
2. The grid is every candidate of the planner's space(s): ``DIR/grid.cfg``.
3. The grid is measured in ``--repeat`` interleaved rounds through the sweep, the driver holding
   each run to ``--memory-gb`` (:mod:`end2end.plan.measured`; resumable), or its measurements
   are taken from ``--measured FILE`` (a results file measured earlier, e.g. the committed
   Figure 10 grid); a candidate with no row is reported as unmeasured.
4. The picks against the grid (:mod:`end2end.plan.study_report`): ``DIR/study.md`` (the report:
   date, machine, commit, command, the goals met or not), ``DIR/study.json`` (its numbers),
   ``DIR/study.cmd`` (the command); the report is printed.

Bad input is one line and exit status 2: a cluster that is not this CPU (``cpu:RANKSx1``), a
calibration file that does not exist, an unknown model or mode, a CKPT no mode searched takes,
a ``--measured`` file without a row of the model at the sequence.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slapo.errors import ConfigError

from end2end.cli import HelpFormatter, configure_logging, get_logger, number, report_errors
from end2end.results.environment import REPO_ROOT, cpu_model, git_commit

__all__ = ["build_parser", "main", "DEFAULT_CALIBRATION"]

DEFAULT_CALIBRATION = REPO_ROOT / "docs" / "results" / "cpu_proof" / "cpu_profile.json"
PROG = "end2end.plan.cpu_study"
#: ``--knobs`` word for the recipe's defaults (no knob)
DEFAULT_KNOBS = "default"
log = get_logger(PROG)


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option documented)."""
    from end2end.plan.search import DEFAULT_CACHE

    p = argparse.ArgumentParser(prog=f"python -m {PROG}", formatter_class=HelpFormatter,
                                description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a zoo name (e.g. cpu/bert), a shape or an HF config.json")
    p.add_argument("--out", required=True, metavar="DIR", help="where the grid, the "
                   "measurements and the report go")
    p.add_argument("--cluster", default="cpu:2x1", help="cpu:RANKSx1: gloo ranks on this CPU")
    p.add_argument("--calibration", default=str(DEFAULT_CALIBRATION),
                   help="the cpu profile's calibration file")
    p.add_argument("--seq", type=number(int, minimum=1), default=256, help="sequence length")
    p.add_argument("--global-batch", type=number(int, minimum=1), nargs="+", default=None,
                   metavar="B", help="global batches planned (default: 4 per rank)")
    p.add_argument("--modes", nargs="+", default=None, metavar="M",
                   help="modes searched (default: all the planner's)")
    p.add_argument("--ckpt", nargs="+", default=(), metavar="C",
                   help="CKPT values searched, each where the mode takes it (default: the "
                        "planner's)")
    p.add_argument("--tp", type=number(int, minimum=1), nargs="+", default=(), metavar="T",
                   help="tensor-parallel sizes searched (default: all)")
    p.add_argument("--pp", type=number(int, minimum=1), nargs="+", default=(), metavar="P",
                   help="pipeline sizes searched (default: all)")
    p.add_argument("--accumulation", type=number(int, minimum=1), nargs="+", default=(),
                   metavar="A", help="micro-batches per replica and step searched (1: no "
                   "gradient accumulation; default: the planner's micro-batches)")
    p.add_argument("--knobs", nargs="+", default=[DEFAULT_KNOBS], metavar="K",
                   help="recipe knobs searched where a layout takes them, each a knob text or "
                        f"'{DEFAULT_KNOBS}' (the recipe's defaults; the default, as the "
                        "committed studies ran), e.g. --knobs default sequence_parallel=True")
    p.add_argument("--memory-gb", type=number(float, above=0), default=None, metavar="G",
                   help="memory cap per rank: predictions and measurements above it do not fit")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--repeat", type=number(int, minimum=1), default=3, metavar="R",
                     help="measured rounds, interleaved (median per candidate)")
    how.add_argument("--measured", default="", metavar="FILE",
                     help="take the measurements from this results file instead of measuring")
    p.add_argument("--top", type=number(int, minimum=1), default=3, metavar="K",
                   help="the planner's picks: its K best predicted to fit")
    p.add_argument("--steps", type=number(int, minimum=1), default=3, help="timed steps a run")
    p.add_argument("--warmup", type=number(int, minimum=0), default=1,
                   help="untimed steps before them")
    p.add_argument("--timeout", type=number(float, above=0), default=600.0,
                   help="seconds one measured run or one simulation may take")
    p.add_argument("--budget", type=number(float, above=0), default=12.0,
                   help="minutes of simulation per planned batch")
    p.add_argument("--max-candidates", type=number(int, minimum=1), default=None,
                   help="simulate at most this many candidates per planned batch")
    p.add_argument("--jobs", type=number(int, minimum=1), default=1,
                   help="simulations at a time")
    p.add_argument("--cache", default=str(DEFAULT_CACHE),
                   help="folder of cached simulations ('' for none)")
    p.add_argument("--debug", action="store_true", help="raise errors with their traceback")
    return p


def _cluster(args: argparse.Namespace):
    from end2end.plan.cluster import parse_cluster

    if not Path(args.calibration).is_file():
        raise ConfigError(f"--calibration {args.calibration}: no such file", call=PROG,
                          hint="give the cpu profile's calibration (e.g. docs/results/cpu_proof/"
                               "cpu_profile.json) or measure one: python -m "
                               "end2end.simulate.calibrate")
    cluster = parse_cluster(args.cluster, args.calibration)
    if cluster.profile != "cpu" or cluster.nodes != 1:
        raise ConfigError(f"--cluster {args.cluster}: the study measures on this CPU", call=PROG,
                          hint="give cpu:RANKSx1, e.g. cpu:2x1 (2 gloo ranks)")
    return cluster.with_budget(args.memory_gb)


def _knob_texts(given: Sequence[str]) -> Tuple[str, ...]:
    """``--knobs`` as canonical texts (``default``: ``""``)."""
    from end2end.spec.knobs import format_knobs, parse_knobs

    return tuple("" if k == DEFAULT_KNOBS else format_knobs(parse_knobs(k, "--knobs"))
                 for k in given)


def _options(args: argparse.Namespace):
    from end2end.plan.limits import SpaceLimits, accepted_ckpt
    from end2end.plan.search import SearchOptions
    from end2end.plan.space import PLANNED_MODES

    modes = tuple(args.modes or PLANNED_MODES)
    for mode in modes:
        if mode not in PLANNED_MODES:
            raise ConfigError(f"--modes {mode}: not a mode the planner searches", call=PROG,
                              hint="use some of " + ", ".join(PLANNED_MODES))
    for value in args.ckpt:
        if not any(accepted_ckpt(m, value) for m in modes):
            raise ConfigError(f"--ckpt {value}: no mode searched takes it", call=PROG,
                              hint="ratios in [0, 1] or op (Slapo modes), selective/full "
                                   "(megatron), 0/1 (the other baselines)")
    limits = SpaceLimits(tuple(args.ckpt), tuple(args.tp), tuple(args.pp),
                         tuple(args.accumulation), _knob_texts(args.knobs))
    return SearchOptions(args.budget * 60, args.jobs, args.max_candidates,
                         Path(args.cache) if args.cache else None, args.timeout, modes,
                         progress=log.info, limits=limits)


def _plan_all(args: argparse.Namespace, cluster, options) -> Tuple[list, Any, List[str]]:
    """Plan every batch: the grid, the first plan with every plan's ranking merged into it
    (best first) and one line per plan."""
    from end2end.plan.search import default_batch, plan

    grid, ranked, lines, results = [], [], [], []
    for batch in args.global_batch or [default_batch(cluster)]:
        r = plan(args.model, cluster, args.seq, batch, None, 0, options)
        grid += r.space.candidates
        ranked += r.ranked
        results.append(r)
        lines.append(f"* global batch {batch}: {len(r.space.candidates)} candidates "
                     f"({r.space.total} before the rules), {len(r.ranked)} simulated, "
                     f"{sum(1 for e in r.ranked if e.prediction and e.prediction.fits)} "
                     f"predicted to fit; {r.wall_s:.0f} s")
    ranked.sort(key=lambda e: (not (e.prediction and e.prediction.fits),
                               -(e.prediction.samples_per_s if e.prediction else 0.0)))
    return grid, dataclasses.replace(results[0], ranked=ranked), lines


def _measurements(args: argparse.Namespace, out: Path, grid) -> Tuple[Dict, str]:
    """Each candidate's :class:`Measured` and a line saying where they come from."""
    from end2end.plan.measured import grid_parts, judge, measure_grid, part_paths, read_measured

    if args.measured:
        path = Path(args.measured)
        rows = read_measured(path, grid)
        where = f"from `{path}` (measured earlier)"
    else:
        status = measure_grid(out, grid, args.repeat, args.steps, args.warmup, args.timeout,
                              args.memory_gb)
        if status:
            raise SystemExit(status)
        rows = {}
        for k, part in enumerate(grid_parts(grid), start=1):
            _, results = part_paths(out, k)
            if results.is_file():
                rows.update(read_measured(results, part))
        rounds = f"{args.repeat} interleaved round" + ("s" if args.repeat > 1 else "")
        where = (f"measured here in {rounds} of {args.warmup} warm-up + {args.steps} timed "
                 f"steps (`{out}/part-K.cfg` into `{out}/measured-K.tsv`)")
    return {c: judge(rows.get(c, []), args.memory_gb) for c in grid}, where


def _context(args, cluster, plan_lines: List[str], grid, where: str) -> List[str]:
    from end2end.simulate.profiles import get_profile

    cap = f"{args.memory_gb:g} GB per rank" if args.memory_gb else "none"
    limits = ", ".join(f"{k} {' '.join(map(str, v))}" for k, v in
                       (("CKPT", args.ckpt), ("TP", args.tp), ("PP", args.pp),
                        ("accumulation", args.accumulation)) if v) or "none"
    return [f"Planned (simulation only) on {cluster.text} with the "
            f"{get_profile('cpu', cluster.calibration).provenance}; seq {args.seq}, modes "
            f"{' '.join(args.modes) if args.modes else 'all'}, limits: {limits}, memory cap: "
            f"{cap}.", ""] + plan_lines + [
            "", f"Grid: {len(grid)} candidates (`grid.cfg`), {where}."]


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """The study (module docstring)."""
    from end2end.models import get_model_spec
    from end2end.plan.measured import check_measured, write_config
    from end2end.plan.report import json_rows
    from end2end.plan.study_report import compare, markdown, summary

    cluster, options = _cluster(args), _options(args)
    get_model_spec(args.model)  # an unknown model: the zoo's one-line error, before planning
    if args.measured:  # before any simulation
        check_measured(Path(args.measured), args.model, args.seq)
    out = Path(args.out)
    grid, merged, plan_lines = _plan_all(args, cluster, options)
    ranked = merged.ranked
    out.mkdir(parents=True, exist_ok=True)
    command = f"python -m {PROG} {shlex.join(argv)}"
    (out / "study.cmd").write_text(command + "\n")
    write_config(out / "grid.cfg", grid, args.steps, args.warmup,
                 f"{command}\nthe grid: every candidate of the planner's space(s); lines that "
                 "share a results key (they differ in micro-batch only)\nare measured from "
                 "separate files (part-K.cfg)")
    (out / "planned.jsonl").write_text("".join(json.dumps(r) + "\n"
                                               for r in json_rows(merged)))
    measured, where = _measurements(args, out, grid)
    comparison = compare(grid, ranked, measured, args.top)
    text = markdown(comparison, f"The planner measured on this CPU: {args.model} on "
                    f"{cluster.text} (issue 40, item 4)",
                    _context(args, cluster, plan_lines, grid, where), command, cpu_model(),
                    git_commit())
    (out / "study.md").write_text(text)
    (out / "study.json").write_text(json.dumps(summary(comparison), indent=1) + "\n")
    print(text, flush=True)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; the exit status (0 done, 2 bad input, 130 interrupted)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    configure_logging()
    try:
        return report_errors(PROG, lambda: run(args, argv), args.debug)
    except SystemExit as stop:  # the sweep was interrupted or refused: its status
        return int(stop.code or 0)


if __name__ == "__main__":
    sys.exit(main())
