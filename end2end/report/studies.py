"""Generated blocks of the studies beside Figure 7: the ablation and the auto-tuning study.

=============================  ===========================================================
``ablation FILE``              the ablation's steps from its results file: samples/s per step
                               (median, min-max, rounds), per rank, and the speedup over
                               vanilla HF (:func:`end2end.results.ablation.format_table`)
``grid DB [STUDY ...]``        an auto-tuning grid from its study database: samples/s per
                               (first symbol x second symbol), the median over the grid
                               studies named (default ``grid``), ``oom``/``fail`` where a
                               candidate did not run, the optimum in bold
``seeds FILE``                 the strategies replayed over seeds (``python -m autotune.seeds
                               --json FILE``): per strategy, how many runs came within the
                               margin of the optimum, after how many evaluations, and the best
                               found (:func:`end2end.results.tuning.summarize`)
``include FILE.md``            a Markdown file a command generated, verbatim, with the command
                               from ``FILE.cmd`` (e.g. ``python -m autotune.pruning``'s report)
=============================  ===========================================================
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from .blocks import ReportError
from .registry import generator, result_rows, results_path

__all__: List[str] = []


@generator("ablation")
def _ablation(root: Path, args: Sequence[str]) -> str:
    from end2end.results.ablation import format_table, summarise

    rows = result_rows(results_path(root, args, "ablation"))
    return (format_table(summarise(rows)) + "\n\nSamples/s of the whole job, median (min-max) "
            "over the interleaved rounds; `vs vanilla` is the ratio of the medians.")


def _grid_args(root: Path, args: Sequence[str]) -> Tuple[Path, List[str]]:
    if not args:
        raise ReportError("'grid' needs a study database",
                          hint="e.g. <!-- report: grid docs/results/autotune-bert.db grid -->")
    path = root / args[0]
    if not path.is_file():
        raise ReportError(f"study database {args[0]} does not exist",
                          hint="commit it under docs/results/, or fix the path")
    return path, list(args[1:]) or ["grid"]


def _cell(outcome: dict, best: float) -> str:
    if outcome["status"] != "ok":
        return outcome["status"]
    text = f"{outcome['throughput']:.3g}"
    return f"**{text}**" if outcome["throughput"] == best else text


@generator("grid")
def _grid(root: Path, args: Sequence[str]) -> str:
    from end2end.results.tuning import grid_outcomes

    path, studies = _grid_args(root, args)
    outcomes = {tuple(json.loads(k).items()): v for k, v in
                grid_outcomes(str(path), studies).items()}
    names = [name for name, _ in next(iter(outcomes))]
    if len(names) != 2:
        raise ReportError(f"'grid' draws two symbols, the study has {names}",
                          hint="a grid over batch size x checkpoint ratio")
    cells: Dict[Tuple, dict] = {(k[0][1], k[1][1]): v for k, v in outcomes.items()}
    rows_, cols = sorted({r for r, _ in cells}), sorted({c for _, c in cells})
    best = max(v["throughput"] for v in cells.values() if v["status"] == "ok")
    lines = [f"| {names[0]} \\ {names[1]} | " + " | ".join(f"{c:g}" for c in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for r in rows_:
        lines.append(f"| {r:g} | " + " | ".join(
            _cell(cells[(r, c)], best) if (r, c) in cells else "-" for c in cols) + " |")
    return "\n".join(lines) + (
        f"\n\nSamples/s per candidate, the median over the grid stud"
        f"{'y' if len(studies) == 1 else 'ies'} {', '.join(f'`{s}`' for s in studies)} of "
        f"[`{args[0]}`](/{args[0]}); `oom` where any of them ran out of the memory budget; "
        "the optimum in bold.")


@generator("seeds")
def _seeds(root: Path, args: Sequence[str]) -> str:
    from end2end.results.tuning import SeedRun, summarize

    path = results_path(root, [a for a in args if not a.startswith("--within=")], "seeds")
    within = next((float(a.split("=", 1)[1]) for a in args if a.startswith("--within=")), 0.05)
    try:
        runs = [SeedRun(**json.loads(line)) for line in path.read_text().splitlines()
                if line.strip()]
    except (ValueError, TypeError) as exc:
        raise ReportError(f"{path.name} is not the JSON lines of python -m autotune.seeds "
                          f"({exc})", hint="re-run autotune.seeds with --json FILE") from None
    if not runs:
        raise ReportError(f"{path.name} has no runs", hint="re-run autotune.seeds --json FILE")
    tpe = sum(r.strategy == "tpe" for r in runs)
    return summarize(runs, within) + (
        "\n\nEach run replays its strategy on the measured grid (nothing measured again): the "
        f"search once (it is deterministic), TPE once per seed ({tpe} seeds); a run stops at "
        f"its budget ({max(r.evaluations for r in runs)} evaluations at most here).")


@generator("include")
def _include(root: Path, args: Sequence[str]) -> str:
    """A committed file that a command generated, and the command from ``FILE.cmd`` beside it:
    a Markdown file verbatim (e.g. ``python -m autotune.pruning ... > FILE.md``), a text file
    in a ``text`` fence (e.g. the planner's report). The ``.cmd`` file's ``#`` lines are notes
    on the run (when, where), shown after the command."""
    path = results_path(root, args, "include")
    command_file = path.with_suffix(".cmd")
    if path.suffix not in (".md", ".txt") or not command_file.is_file():
        raise ReportError(f"'include' takes a generated .md or .txt file with its .cmd beside "
                          f"it, got {args[0]}", hint=f"write the command that made it into "
                          f"{command_file.name}")
    lines = [line.strip() for line in command_file.read_text().splitlines() if line.strip()]
    commands = [line for line in lines if not line.startswith("#")]
    notes = " ".join(line.lstrip("#").strip() for line in lines if line.startswith("#"))
    body = path.read_text().strip()
    if path.suffix == ".txt":
        body = "```text\n" + body + "\n```"
    return (body + "\n\nMade by " + ", then ".join(f"`{c}`" for c in commands) + "."
            + (f" {notes}" if notes else ""))
