"""``python -m end2end.plan.published``: the planner against layouts their authors chose (issue
40, item 3; docs/planning.md, "Against published layouts").

For each row of ``docs/results/plan/published_layouts.tsv`` (:mod:`end2end.plan.layouts`):

1. the published layout is simulated as one config line, as the planner simulates a candidate
   (:func:`end2end.plan.predict.reduced_models`, ``simulate_cached`` and ``predict``: the same
   reduced-depth extrapolation, the same cache); a layout the driver refuses, or that breaks
   the planner's divisibility rule (:func:`end2end.plan.rules.divisibility_problem`: uneven
   pipeline stages, TP across nodes), is ``refused``, with the reason;
2. the planner (:func:`end2end.plan.search.plan`) plans the same model on the same cluster,
   sequence, global batch and dtype;
3. a results row: both layouts and their predicted samples/s, the ratio planner / published,
   whether the planner's choice is within 10 % of the published layout's prediction or better
   (the issue's criterion), whether the published layout was in the planner's space and
   simulated by it, and why the two differ, from the per-phase breakdown the simulator records
   (the layout's differences, then the phases whose seconds per step differ most, and memory).

A row that fails (a layout the driver refuses, a simulation that fails, a model that fits
nowhere) is written with its error, never dropped. The results file is rewritten after every
row, so an interrupted run keeps what it finished, and it is merged by id: a run with ``--only``
replaces its rows and keeps the others' (a long table runs in parts), each row with the commit,
the time it finished and the search options it ran with. Both sides are predictions of the same
simulator; the published throughput (``measured_samples_s``) is printed beside them for
reference, not compared.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from slapo.errors import ConfigError, SlapoError

from end2end.cli import HelpFormatter, get_logger, number, one_line, report_errors
from end2end.models import get_model_spec
from end2end.plan.layouts import DEFAULT_TABLE, PublishedLayout, read_layouts
from end2end.plan.predict import PHASES, Prediction, predict, reduced_models, simulate_cached
from end2end.plan.rules import divisibility_problem
from end2end.plan.search import DEFAULT_CACHE, PlanResult, SearchOptions, plan, resolve_model
from end2end.plan.space import Candidate

__all__ = ["RESULT_COLUMNS", "WITHIN", "REFUSED", "Comparison", "simulate_layout", "compare_row",
           "why_different", "results_text", "read_results", "build_parser", "main"]

log = get_logger("end2end.plan.published")

#: The planner's best must be predicted at least this fraction of the published layout's
#: samples/s (issue 40: "within 10 % of the published layout's predicted throughput or better")
WITHIN = 0.9
#: ``published_status`` of a layout the driver does not run (the row's error says why)
REFUSED = "refused"
DEFAULT_OUT = Path("docs/results/plan/published.tsv")
RESULT_COLUMNS = ("id", "status", "published", "published_status", "published_samples_s",
                  "planner_best", "planner_samples_s", "ratio", "within_10pct",
                  "published_in_space", "why", "measured_samples_s", "candidates_simulated",
                  "plan_seconds", "error", "commit", "finished", "options")


@dataclass
class Comparison:
    """One results row (:data:`RESULT_COLUMNS`); ``status``: ``ok`` or ``error``."""

    id: str
    status: str = "ok"
    published: str = ""
    published_status: str = ""
    published_samples_s: Optional[float] = None
    planner_best: str = ""
    planner_samples_s: Optional[float] = None
    ratio: Optional[float] = None
    within_10pct: str = "n/a"
    published_in_space: str = ""
    why: str = ""
    measured_samples_s: Optional[float] = None
    candidates_simulated: int = 0
    plan_seconds: float = 0.0
    error: str = ""
    commit: str = ""
    finished: str = ""
    options: str = ""

    def cells(self) -> List[str]:
        def text(v) -> str:
            if v is None:
                return ""
            return f"{v:.6g}" if isinstance(v, float) else " ".join(str(v).split())
        return [text(getattr(self, k)) for k in RESULT_COLUMNS]


def simulate_layout(cand: Candidate, cluster, options: SearchOptions, folder: Path
                    ) -> Prediction:
    """``cand`` simulated as the planner simulates a candidate (module docstring, step 1)."""
    models = reduced_models(cand, folder, options.reduce_above)
    runs = [(k, simulate_cached(cand.run_spec(model=name), cluster, options.cache,
                                options.timeout)) for k, name in models]
    return predict(cand, runs, cluster)


def _key(c: Candidate) -> tuple:
    return (c.mode, c.tp, c.pp, c.micro, c.ckpt, c.knobs)


_NOT_SIMULATED = {
    "in space, not simulated": "the planner did not simulate the published layout (its budget "
                               "or --max-candidates)",
    "not in space": "the published layout is not in the planner's space (its micro-batches, "
                    "CKPT values, knobs and modes: docs/planning.md)"}


def _in_space(cand: Candidate, result: PlanResult) -> str:
    if any(_key(e.candidate) == _key(cand) for e in result.ranked):
        return "simulated"
    if any(_key(c) == _key(cand) for c in result.space.candidates):
        return "in space, not simulated"
    return "not in space"


def _layout_changes(pub: Candidate, best: Candidate) -> str:
    pairs = [("mode", pub.mode, best.mode), ("tp", pub.tp, best.tp), ("pp", pub.pp, best.pp),
             ("dp", pub.dp, best.dp), ("micro", pub.micro, best.micro),
             ("ckpt", pub.ckpt, best.ckpt), ("knobs", pub.knobs or "-", best.knobs or "-")]
    return ", ".join(f"{k} {a} -> {b}" for k, a, b in pairs if a != b)


def why_different(pub: Candidate, pub_pred: Prediction, best: Optional[Candidate],
                  best_pred: Optional[Prediction], in_space: str) -> str:
    """A short reason from the layouts and their per-phase predictions (module docstring)."""
    if best is None or best_pred is None:
        return "the planner found no candidate predicted to fit"
    if _key(pub) == _key(best):
        return "the planner chose the published layout"
    parts = [_layout_changes(pub, best)]
    if pub_pred.status == REFUSED:
        parts.append(f"the driver refuses the published layout: {pub_pred.error}")
    elif not pub_pred.fits:
        parts.append(f"the published layout is predicted {pub_pred.status}: "
                     f"{pub_pred.error or 'no throughput'}")
    else:
        deltas = sorted(((k, best_pred.phases.get(k, 0.0) - pub_pred.phases.get(k, 0.0))
                         for k in PHASES), key=lambda kv: -abs(kv[1]))
        shown = ", ".join(f"{k} {d:+.3g} s" for k, d in deltas[:2] if abs(d) > 0)
        parts.append(f"step {pub_pred.step_time:.3g} s -> {best_pred.step_time:.3g} s"
                     + (f" ({shown})" if shown else ""))
        parts.append(f"memory {pub_pred.memory_gb:.3g} -> {best_pred.memory_gb:.3g} GB/rank")
    if in_space in _NOT_SIMULATED:
        parts.append(_NOT_SIMULATED[in_space])
    return "; ".join(p.rstrip(".") for p in parts if p)


def compare_row(row: PublishedLayout, options: SearchOptions) -> Comparison:
    """Compare one row (module docstring); a failure is recorded in the result."""
    from end2end.plan.cluster import parse_cluster

    out = Comparison(row.id, measured_samples_s=row.measured_samples_s())
    folder = options.cache or DEFAULT_CACHE
    errors = []
    try:
        cluster = parse_cluster(row.cluster)
        model, _ = resolve_model(row.model, row.seq, folder)
    except SlapoError as exc:
        out.status, out.error = "error", one_line(exc)
        return out
    pub = row.candidate(model)
    out.published = pub.label
    problem = divisibility_problem(get_model_spec(model), pub.tp, pub.pp, cluster.gpus_per_node)
    try:
        if problem:  # the planner's own rule: its simulations would not be a run of this layout
            raise ConfigError(f"the planner's divisibility rule: {problem}",
                              call="end2end.plan.published")
        pub_pred = simulate_layout(pub, cluster, options, folder)
    except SlapoError as exc:  # the driver (or the rule) refuses the layout
        pub_pred = Prediction(REFUSED, one_line(exc))
    out.published_status = pub_pred.status
    if pub_pred.fits:
        out.published_samples_s = pub_pred.samples_per_s
    elif pub_pred.status != "sim-oom":  # out of memory is a result (in ``why``), not an error
        errors.append(f"published: {pub_pred.error or pub_pred.status}")
    began = time.perf_counter()
    try:
        result = plan(model, cluster, row.seq, row.global_batch, row.dtype, 0, options)
    except SlapoError as exc:
        out.status, out.plan_seconds = "error", time.perf_counter() - began
        out.error = "; ".join(errors + [f"planner: {one_line(exc)}"])
        return out
    out.plan_seconds, out.candidates_simulated = result.wall_s, len(result.ranked)
    out.published_in_space = _in_space(pub, result)
    best = result.best
    if best is not None and best.prediction is not None:
        out.planner_best = best.candidate.label
        out.planner_samples_s = best.prediction.samples_per_s
    if out.planner_samples_s and out.published_samples_s:
        out.ratio = out.planner_samples_s / out.published_samples_s
        out.within_10pct = "yes" if out.ratio >= WITHIN else "no"
    elif out.published_samples_s:
        out.within_10pct = "no"  # the published layout fits, the planner found nothing
    out.why = why_different(pub, pub_pred, best.candidate if best else None,
                            best.prediction if best else None, out.published_in_space)
    out.error = "; ".join(errors)
    return out


def results_text(rows: List[List[str]], header: List[str]) -> str:
    """The results file: ``#`` header lines, the column names, one row of cells per line."""
    lines = [f"# {h}" for h in header] + ["\t".join(RESULT_COLUMNS)]
    lines += ["\t".join(cells) for cells in rows]
    return "\n".join(lines) + "\n"


def read_results(path: Path) -> Dict[str, List[str]]:
    """The rows of an earlier results file by id (empty when there is none).

    Raises:
        ConfigError: a file whose columns are not :data:`RESULT_COLUMNS` (an older format).
    """
    if not path.is_file():
        return {}
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    if not lines:
        return {}
    if lines[0].split("\t") != list(RESULT_COLUMNS):
        raise ConfigError(f"{path}: its columns are not this version's "
                          f"({', '.join(RESULT_COLUMNS)})",
                          call="end2end.plan.published",
                          hint="move it away, or run every row again (without --only)")
    return {cells[0]: cells for cells in (ln.split("\t") for ln in lines[1:])}


def _header(table: Path) -> List[str]:
    try:  # the table as the reader of the results would name it: from where the command ran
        table = table.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    return ["the planner against published layouts (issue 40, item 3; docs/planning.md)",
            f"python -m end2end.plan.published --table {table} [--only ID ...]: rows merged by "
            "id; each row's commit, finish time (UTC) and search options are its own",
            f"within_10pct: planner_samples_s >= {WITHIN} x published_samples_s (both "
            "predicted); measured_samples_s: the published throughput, for reference"]


def _options_text(args: argparse.Namespace) -> str:
    return (f"budget={args.budget:g}min jobs={args.jobs} max_candidates="
            f"{args.max_candidates or '-'} reduce_above={args.reduce_above} "
            f"timeout={args.timeout:g}s")


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option documented)."""
    from end2end.plan.predict import REDUCE_ABOVE

    p = argparse.ArgumentParser(
        prog="python -m end2end.plan.published", formatter_class=HelpFormatter,
        description="For every published layout of the table: simulate it, plan the same "
                    "model, cluster, sequence and global batch, and write both predictions, "
                    "their ratio and why they differ.",
        epilog="Predictions, not measurements. Exit status: 0 done (failed rows are in the "
               "results with their error); 2 a usage error (one line on stderr).")
    p.add_argument("--table", default=str(DEFAULT_TABLE), help="the published layouts")
    p.add_argument("--only", action="append", default=[], metavar="ID",
                   help="compare only this row (repeatable)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="the results file (TSV)")
    p.add_argument("--budget", type=number(float, above=0), default=12.0,
                   help="minutes of simulation for each row's plan")
    p.add_argument("--max-candidates", type=number(int, minimum=1), default=None,
                   help="simulate at most this many candidates per plan")
    p.add_argument("--jobs", type=number(int, minimum=1), default=2,
                   help="simulations at a time (one process each)")
    p.add_argument("--cache", default=str(DEFAULT_CACHE),
                   help="folder of cached simulations ('' for none)")
    p.add_argument("--timeout", type=number(float, above=0), default=600,
                   help="seconds one simulation may take")
    p.add_argument("--reduce-above", type=number(int, minimum=0), default=REDUCE_ABOVE,
                   metavar="L", help="layers per stage above which candidates (and the "
                   "published layout) are simulated at reduced depth (as python -m end2end.plan)")
    p.add_argument("--debug", action="store_true", help="raise errors with their traceback")
    return p


def run(args: argparse.Namespace) -> int:
    """Compare the selected rows, writing the results after each, merged by id with the rows of
    ``--out`` not selected (:func:`build_parser`)."""
    from end2end.results.environment import git_commit

    rows = read_layouts(Path(args.table))
    known = [r.id for r in rows]
    unknown = [i for i in args.only if i not in known]
    if unknown:
        raise ConfigError(f"--only {', '.join(unknown)}: not a row of {args.table}",
                          call="end2end.plan.published", hint="use one of " + ", ".join(known))
    order = [r.id for r in rows]
    rows = [r for r in rows if not args.only or r.id in args.only]
    options = SearchOptions(args.budget * 60, args.jobs, args.max_candidates,
                            Path(args.cache) if args.cache else None, args.timeout,
                            progress=lambda text: log.info("  plan " + text),
                            reduce_above=args.reduce_above)
    out, header = Path(args.out), _header(Path(args.table))
    kept = read_results(out) if args.only else {}
    commit, settings = git_commit(), _options_text(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    for i, row in enumerate(rows, start=1):
        log.info(f"[{i}/{len(rows)}] {row.id}: {row.model} on {row.cluster}, seq {row.seq}, "
                 f"global batch {row.global_batch}")
        began = time.perf_counter()
        try:
            c = compare_row(row, options)
        except Exception as exc:  # recorded, never dropped (module docstring)
            if args.debug:
                raise
            c = Comparison(row.id, status="error", error=f"{type(exc).__name__}: "
                           f"{one_line(exc)}")
        c.commit, c.options = commit, settings
        c.finished = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        kept[row.id] = c.cells()
        out.write_text(results_text([kept[i] for i in order if i in kept], header))
        ratio = f"{c.ratio:.3f}" if c.ratio is not None else "-"
        log.info(f"[{i}/{len(rows)}] {row.id}: {c.status}; published {c.published} "
                 f"{c.published_status} {c.published_samples_s or 0:.4g} samples/s; planner "
                 f"{c.planner_best or '-'} {c.planner_samples_s or 0:.4g} samples/s; ratio "
                 f"{ratio}, within 10 %: {c.within_10pct} ({time.perf_counter() - began:.0f} s)"
                 + (f"; error: {c.error}" if c.error else ""))
    log.info(f"wrote {out} ({len(rows)} rows run, {len(kept)} in the file)")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    return report_errors("end2end.plan.published", lambda: run(args), args.debug)


if __name__ == "__main__":
    sys.exit(main())
