"""Generated blocks of the paper-scale studies predicted by the simulator (Figures 9 and 10 on
``v100-32gb``), each beside what the paper gives.

=====================================  ========================================================
``ablation-predicted FILE``            the ablation's steps from a simulated results file
                                       (``python -m end2end.simulate`` of
                                       ``ablation/configs/paper-*.cfg``):
                                       per step its run, predicted status, samples/s (all GPUs
                                       and per GPU), the speedup over vanilla and the predicted
                                       peak memory per GPU; a ``sim-oom`` step shows the
                                       samples/s it would reach if it fit, never a speedup
``grid-predicted FILE [--seeds FILE]`` a tuning grid from its predictions (``python -m
                                       autotune.predicted_grid``: JSON lines): predicted
                                       samples/s per (batch x ratio), ``sim-oom`` where it is
                                       predicted not to fit, the predicted optimum in bold, the
                                       paper's Figure 10 optimum and out-of-memory cells marked
                                       (:data:`PAPER_FIGURE10`), then the two side by side;
                                       ``--seeds``: the strategies replayed on the prediction;
                                       the command from ``FILE.cmd`` when it exists
=====================================  ========================================================

Every number is labelled a prediction; measured rows are refused (a measured ablation has the
kind ``ablation``, a measured grid ``grid``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from .blocks import ReportError
from .registry import generator, result_rows, results_path

__all__ = ["PAPER_FIGURE10", "simulated_steps"]

_PAPER_OOM = ({(b, r) for b in (24, 26, 28) for r in (0.25, 0.34, 0.5)}
              | {(20, 0.25), (22, 0.25)})
#: The paper's Figure 10 (BERT-1B series), from its plot data (slapo ``benchmark/plot/
#: autotune-1b.py``, hard-coded measurements): batches 8-28 step 2 x ratios 0.25-1 (no 0).
PAPER_FIGURE10 = {
    "best": (18, 0.25, 17.25), "range": (11.5, 17.25), "oom": frozenset(_PAPER_OOM),
    "full_at_best": 13.74,  # batch 18 at ratio 1 (every layer checkpointed)
    "batches": tuple(range(8, 29, 2)), "ratios": (0.25, 0.34, 0.5, 0.67, 0.84, 0.92, 1.0),
    "source": "the plot data of the paper's Figure 10, BERT-1B series (slapo benchmark/plot/"
              "autotune-1b.py; artifact notes §1.7)",
}


# -- Figure 9 ------------------------------------------------------------------------------------
def simulated_steps(path: Path) -> List[Tuple]:
    """(step, row) per row of a simulated ablation file, in step order."""
    from end2end.results.ablation import AblationError, step_of
    from end2end.results.summary import is_predicted

    rows = result_rows(path)
    if not is_predicted(rows):
        raise ReportError(f"'ablation-predicted': {path.name} holds measured rows",
                          hint="give the simulator's rows, or use <!-- report: ablation FILE -->")
    try:
        steps = [(step_of(r), r) for r in rows]
    except AblationError as exc:
        raise ReportError(f"'ablation-predicted': {path.name}: {exc}",
                          hint="give the results of one ablation config") from None
    if len({s.index for s, _ in steps}) != len(steps):
        raise ReportError(f"'ablation-predicted': {path.name} has two rows for one step",
                          hint="simulate the config once into a fresh file")
    return sorted(steps, key=lambda item: item[0].index)


def _step_line(step, row, vanilla) -> str:
    run = f"`{row.impl}` bs={row.batch}" + (f" ckpt={row.ckpt}" if row.ckpt != "0" else "")
    mem = f"{row.per_gpu_mem:.3g}" if row.per_gpu_mem is not None else "-"
    if row.status == "sim" and row.thrpt is not None:
        ratio = f"{row.thrpt / vanilla:.2f}x" if vanilla else "-"
        return (f"| {step.label} | {run} | {row.ngpu} | sim | {row.thrpt:.3g} | "
                f"{row.thrpt / row.ngpu:.3g} | {ratio} | {mem} |")
    if row.status == "sim-oom" and row.thrpt is not None:
        return (f"| {step.label} | {run} | {row.ngpu} | **sim-oom** | ({row.thrpt:.3g} if it "
                f"fit) | - | - | {mem} |")
    return f"| {step.label} | {run} | {row.ngpu} | **{row.status}** | - | - | - | {mem} |"


@generator("ablation-predicted")
def _ablation_predicted(root: Path, args: Sequence[str]) -> str:
    path = results_path(root, args, "ablation-predicted")
    steps = simulated_steps(path)
    vanilla = next((r.thrpt for s, r in steps if s.index == 0 and r.status == "sim"), None)
    head = steps[0][1]
    lines = ["| Step | Run | GPUs | predicted | samples/s | per GPU | vs vanilla | peak GB/GPU |",
             "|---|---|---:|---|---:|---:|---:|---:|"]
    lines += [_step_line(s, r, vanilla) for s, r in steps]
    oom = [r for _, r in steps if r.status != "sim"]
    notes = "".join(f"\n- {s.label}: {r.error}" for s, r in steps if r.status != "sim")
    return "\n".join(lines) + (
        f"\n\nPredicted (simulated, no GPU ran these) for `{head.model}`, seq {head.seq}, "
        f"{head.dtype or 'the config dtype'}, on `{head.device}`; `vs vanilla` is a ratio of "
        "two predictions of total samples/s (the steps run on 1 and on 8 GPUs, as in the "
        "paper), `peak GB/GPU` the predicted peak of live tensors. "
        + (f"{len(oom)} of {len(steps)} steps are predicted not to run at the paper's "
           f"batch:{notes}" if oom else "Every step is predicted to fit."))


# -- Figure 10 -----------------------------------------------------------------------------------
def _grid_cells(path: Path) -> Tuple[List[str], Dict[Tuple, dict], Dict[Tuple, float]]:
    """Symbol names, (batch, ratio) -> predicted outcome, (batch, ratio) -> predicted GB."""
    from end2end.results.tuning import load_predictions, predicted_outcomes

    from slapo.errors import TuneError

    try:
        predictions = load_predictions(str(path))
    except TuneError as exc:
        raise ReportError(f"'grid-predicted': {exc.what}", hint=exc.hint) from None
    if not predictions:
        raise ReportError(f"'grid-predicted': {path.name} has no predictions",
                          hint="python -m autotune.predicted_grid --space FILE --predictions "
                          f"{path.name} --simulate")
    names = list(json.loads(next(iter(predictions))))
    if len(names) != 2:
        raise ReportError(f"'grid-predicted' draws two symbols, the predictions have {names}",
                          hint="a grid over batch size x checkpoint ratio")
    cells, memory = {}, {}
    for key, outcome in predicted_outcomes(predictions).items():
        point = tuple(json.loads(key).values())
        cells[point], memory[point] = outcome, predictions[key].memory_gb
    return names, cells, memory


def _cell(outcome: dict, best: float, point: Tuple) -> str:
    text = (f"{outcome['throughput']:.3g}" if outcome["status"] == "ok"
            else "sim-oom" if outcome["status"] == "oom" else outcome["status"])
    text = f"**{text}**" if outcome.get("throughput") == best else text
    paper_best = PAPER_FIGURE10["best"][:2]
    return text + (" ‡" if point == paper_best else " †" if point in PAPER_FIGURE10["oom"]
                   else "")


def _grid_table(names: List[str], cells: Dict[Tuple, dict], best: float) -> List[str]:
    rows, cols = sorted({b for b, _ in cells}), sorted({r for _, r in cells})
    lines = [f"| {names[0]} \\ {names[1]} | " + " | ".join(f"{c:g}" for c in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for b in rows:
        lines.append(f"| {b:g} | " + " | ".join(
            _cell(cells[(b, c)], best, (b, c)) if (b, c) in cells else "-" for c in cols) + " |")
    return lines


def _comparison(cells: Dict[Tuple, dict], memory: Dict[Tuple, float], best_point: Tuple
                ) -> List[str]:
    """The predicted optimum, range and OOM region beside the paper's."""
    paper = PAPER_FIGURE10
    ok = [o["throughput"] for o in cells.values() if o["status"] == "ok"]
    oom = sorted(p for p, o in cells.items() if o["status"] == "oom")
    at_paper_oom = [memory[p] for p in paper["oom"] if memory.get(p) is not None]
    pb, pr, pv = paper["best"]
    rows = [
        ("optimum", f"{pv:g} samples/s at batch {pb}, ratio {pr:g}",
         f"{max(ok):.3g} samples/s at batch {best_point[0]:g}, ratio {best_point[1]:g}"),
        ("samples/s over the grid", f"{paper['range'][0]:g}-{paper['range'][1]:g}",
         f"{min(ok):.3g}-{max(ok):.3g}"),
        ("out of memory", f"{len(paper['oom'])} of {len(paper['batches']) * len(paper['ratios'])}"
         " cells: ratio <= 0.5 at batch >= 24, ratio 0.25 at batch 20-22",
         f"{len(oom)} of {len(cells)} candidates"
         + (": " + ", ".join(f"{b:g}/{r:g}" for b, r in oom) if oom else "")),
    ]
    full, quarter = cells.get((pb, 1.0), {}), cells.get((pb, pr), {})
    if full.get("status") == quarter.get("status") == "ok":
        rows.append((f"ratio {pr:g} over ratio 1 at batch {pb} (6 of 24 layers checkpointed "
                     "instead of 24, in the paper and here)", f"{pv / paper['full_at_best']:.2f}x",
                     f"{quarter['throughput'] / full['throughput']:.2f}x"))
    if at_paper_oom:
        rows.append(("predicted peak per GPU at the paper's OOM cells",
                     "out of memory on a 32 GB V100",
                     f"{min(at_paper_oom):.3g}-{max(at_paper_oom):.3g} GB"))
    return (["| | Paper (8 x V100, measured) | Simulated `v100-32gb` *(predicted)* |",
             "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows])


def _seeds_text(root: Path, path: str) -> str:
    from end2end.results.tuning import SeedRun, summarize

    file = results_path(root, [path], "grid-predicted --seeds")
    try:
        runs = [SeedRun(**json.loads(line)) for line in file.read_text().splitlines()
                if line.strip()]
    except (ValueError, TypeError) as exc:
        raise ReportError(f"{file.name} is not the JSON lines of python -m "
                          f"autotune.predicted_grid --json ({exc})",
                          hint="re-run it with --json FILE") from None
    if not runs:
        raise ReportError(f"{file.name} has no runs", hint="re-run with --json FILE")
    tpe = sum(r.strategy == "tpe" for r in runs)
    return (summarize(runs, 0.05) + "\n\nEach strategy replayed on the predicted grid (the "
            "predictions stand in for measurements; a `sim-oom` candidate is an OOM): the "
            f"search once, TPE once per seed ({tpe} seeds), at most "
            f"{max(r.evaluations for r in runs)} evaluations; `optimum` is the predicted one.")


@generator("grid-predicted")
def _grid_predicted(root: Path, args: Sequence[str]) -> str:
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--seeds"):
        raise ReportError(f"'grid-predicted' takes FILE [--seeds FILE], got {list(args)}",
                          hint="<!-- report: grid-predicted docs/results/x.predictions.jsonl -->")
    path = results_path(root, args[:1], "grid-predicted")
    names, cells, memory = _grid_cells(path)
    fits = {p: o for p, o in cells.items() if o["status"] == "ok"}
    if not fits:
        raise ReportError(f"'grid-predicted': no candidate of {path.name} is predicted to fit",
                          hint="check the predictions (all sim-oom or fail?)")
    best_point = max(fits, key=lambda p: fits[p]["throughput"])
    best = fits[best_point]["throughput"]
    text = "\n".join(_grid_table(names, cells, best)) + (
        f"\n\nPredicted samples/s per candidate (simulated: no GPU ran them) from "
        f"[`{args[0]}`](/{args[0]}); `sim-oom` where the predicted peak does not fit the "
        "GPU's memory; the predicted optimum in bold. Marked from the paper: † out of memory "
        "in its Figure 10, ‡ its optimum (the paper has no ratio-0 column).\n\n"
        + "\n".join(_comparison(cells, memory, best_point))
        + f"\n\nThe paper's values: {PAPER_FIGURE10['source']}.")
    if len(args) == 3:
        text += "\n\n" + _seeds_text(root, args[2])
    command_file = path.with_suffix(".cmd")  # the convention of docs/results/
    if command_file.is_file():
        commands = [c.strip() for c in command_file.read_text().splitlines() if c.strip()]
        text += "\n\nMade by " + ", then ".join(f"`{c}`" for c in commands) + "."
    return text
