"""The generated block ``paper``: the paper's headline numbers beside this artifact's.

``<!-- report: paper --cpu FILE [--v100 FILE] [--fig8 FILE] [--grid DB] [--tune-v100 FILE]
[--ablation FILE] [--ablation-v100 FILE] -->``: one row per claim
of the paper (ASPLOS'24; the values and their sources in :data:`PAPER`), with what the CPU
results (``--cpu``: a Figure 7 results file measured here) say, what the simulator predicts
for the paper's machines (``--v100``: ``single_node_asplos24.cfg`` simulated on ``v100-32gb``;
``--fig8``: ``multi_node_fig8.cfg``), marked as predictions, and the auto-tuning grid's optimum
(``--grid``; ``--tune-v100``: the paper-scale grid's predictions, ``python -m
autotune.predicted_grid``); Figure 9's row reads ``--ablation`` (an ablation measured here,
``ablation/run.sh``) and ``--ablation-v100`` (a simulated paper-scale ablation). Only workloads
of two or more ranks are compared, as the paper's figures compare distributed systems. A paper
value that is not confirmed from a primary source, or that comes from plot data, carries its
mark (:data:`MARKS`) in the cell. A file not given is a cell saying so; measured and simulated
rows are never put into one ratio (:func:`end2end.results.summary.figure7_table` refuses a mixed
file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .blocks import ReportError
from .registry import generator, result_rows

__all__ = ["PAPER", "MARKS", "paper_value"]

# claim -> (the paper's value, its source, its mark: "" for a value stated in the paper's text,
# else a key of MARKS)
PAPER: Dict[str, tuple] = {
    "single": ("2.92x", "arXiv 2302.08005 v2 abstract: 8 x V100 (p3dn.24xlarge), Figure 7", ""),
    "every": ("Slapo-TP or Slapo-ZeRO3 best on every model",
              "the artifact's evaluation conclusion (i), Figure 7", ""),
    "tp": ("1.02x-1.46x", "Slapo-TP / Megatron-LM, Figure 7 (not confirmed from a primary "
           "source)", "unconfirmed"),
    "multi": ("1.41x", "arXiv v2 abstract: up to 64 GPUs (8 nodes of 8 x V100), Figure 8", ""),
    "tune": ("17.25 samples/s at batch 18, ratio 0.25", "Figure 10's plot data (BERT-1B series, "
             "8 x V100; range 11.5-17.25), hard-coded in the artifact's plot/autotune-1b.py "
             "(committed as 'not working')", "plot data"),
    "ablation": ("every step faster than the one before (a figure: no numbers given)",
                 "the artifact's evaluation conclusion (iii), Figure 9 (BERT-1B: steps 1-2 on "
                 "1 GPU, 3-4 on 8)", ""),
}
#: What a mark on a paper value means (said under the table).
MARKS = {"unconfirmed": "not confirmed from a primary source (the paper's text or tables)",
         "plot data": "read from the data of a plot script, not from the paper's text"}
OPTIONS = ("--cpu", "--v100", "--fig8", "--grid", "--tune-v100", "--ablation",
           "--ablation-v100")


def paper_value(key: str) -> str:
    """The paper's value of claim ``key`` with its mark (``1.02x-1.46x *(unconfirmed)*``)."""
    value, _, mark = PAPER[key]
    return f"{value} *({mark})*" if mark else value


def _options(root: Path, args: Sequence[str]) -> Dict[str, Path]:
    if len(args) % 2 or any(a not in OPTIONS for a in args[::2]):
        raise ReportError(f"'paper' takes {' FILE '.join(OPTIONS)} FILE pairs, got {list(args)}",
                          hint="<!-- report: paper --cpu docs/results/cpu.tsv -->")
    out = {flag[2:]: root / path for flag, path in zip(args[::2], args[1::2])}
    if "cpu" not in out:
        raise ReportError("'paper' needs --cpu FILE (a Figure 7 results file)",
                          hint="<!-- report: paper --cpu docs/results/cpu.tsv -->")
    for name, path in out.items():
        if not path.is_file():
            raise ReportError(f"'paper' --{name}: {path.relative_to(root)} does not exist",
                              hint="commit it under docs/results/, or fix the path")
    return out


def _best_ratios(path: Optional[Path]) -> List:
    """Per workload and rank count: (best Slapo / best baseline ratio, panel, n)."""
    from end2end.results.summary import figure7_table, speedups

    if path is None:
        return []
    table = figure7_table(result_rows(path), best=True)
    return [(s.ratio, s.panel, s.n) for s in speedups(table) if s.system == "best-slapo"]


def _where(panel, n: int) -> str:
    return f"`{panel.model}`, {n} rank{'s' if n > 1 else ''}"


def _max_text(ratios: List) -> str:
    """The largest ratio over the multi-rank workloads (the paper's Figure 7 and 8 compare
    distributed systems only; a 1-rank eager vs Slapo line is no such comparison)."""
    from end2end.results.summary import ratio_text

    ratios = [r for r in ratios if r[2] > 1]
    if not ratios:
        return "no multi-rank workload with both sides"
    ratio, panel, n = max(ratios, key=lambda item: item[0].value)
    return f"{ratio_text(ratio)} ({_where(panel, n)})"


def _every_text(ratios: List) -> str:
    """How many workloads with two or more ranks (the paper's comparisons) the best Slapo bar
    leads, and which are within noise or behind, named."""
    from end2end.results.summary import ratio_text

    ratios = [r for r in ratios if r[2] > 1]
    if not ratios:
        return "no workload of 2 or more ranks with both sides"
    noise = [r for r in ratios if r[0].within_noise]
    ahead = [r for r in ratios if r not in noise and r[0].value >= 1]
    behind = [r for r in ratios if r not in noise and r not in ahead]

    def named(items: List) -> str:
        return ", ".join(f"{_where(p, n)} {ratio_text(r)}" for r, p, n in items)

    return (f"ahead on {len(ahead)} of {len(ratios)} workloads of 2 or more ranks"
            + (f"; within noise: {named(noise)}" if noise else "")
            + (f"; behind: {named(behind)}" if behind else ""))


def _megatron_pair(item) -> bool:
    """A Slapo mode under megatron-core against megatron-core's own model (Slapo-TP /
    Megatron-LM), read from the table of modes."""
    from end2end.spec.modes import MODE_TABLE

    mode, base = MODE_TABLE.get(item.system), MODE_TABLE.get(item.baseline)
    return (mode is not None and base is not None and mode.slapo and not base.slapo
            and mode.framework == base.framework == "megatron")


def _tp_text(path: Optional[Path]) -> str:
    from end2end.results.summary import figure7_table, speedups

    if path is None:
        return "not given"
    items = [s for s in speedups(figure7_table(result_rows(path))) if _megatron_pair(s)]
    if not items:
        return "no Slapo-TP / Megatron-LM pair"
    values = sorted(s.ratio.value for s in items)
    span = f"{values[0]:.2f}x" + (f"-{values[-1]:.2f}x" if len(values) > 1 else "")
    return f"{span} over {len(items)} workload{'s' if len(items) > 1 else ''} (medians)"


def _grid_studies(db: Path) -> List[str]:
    """The grid studies of ``db`` (``grid``, ``grid-2``, ...): the optimum is taken over their
    median per candidate, as the ``grid`` block and ``autotune.seeds`` do."""
    import optuna

    names = sorted(n for n in optuna.get_all_study_names(storage=f"sqlite:///{db}")
                   if n == "grid" or n.startswith("grid-"))
    return names or ["grid"]


def _grid_text(db: Optional[Path]) -> str:
    import json

    from end2end.results.tuning import grid_outcomes, grid_workload

    if db is None:
        return "not given"
    studies = _grid_studies(db)
    outcomes = grid_outcomes(str(db), studies)
    key, best = max(((k, o) for k, o in outcomes.items() if o["status"] == "ok"),
                    key=lambda item: item[1]["throughput"])
    where = ", ".join(f"{k} {v:g}" for k, v in json.loads(key).items())
    return (f"{best['throughput']:.3g} samples/s at {where} ({grid_workload(str(db), studies)}; "
            f"median of {len(studies)} grid stud{'y' if len(studies) == 1 else 'ies'})")


def _predicted(path: Optional[Path], text) -> str:
    """``text(path)`` marked as a prediction, or why there is none."""
    from end2end.results.summary import is_predicted

    if path is None:
        return "not yet simulated"
    if not is_predicted(result_rows(path)):
        raise ReportError(f"'paper': {path.name} holds measured rows where predictions are "
                          "expected", hint="give the simulator's rows (python -m "
                          "end2end.simulate CONFIG --device v100-32gb --results FILE)")
    return f"{text(path)} *(predicted)*"


def _tune_v100_text(path: Path) -> str:
    """The predicted optimum of a paper-scale grid's predictions and how many are OOM."""
    import json

    from end2end.results.tuning import (load_predictions, predicted_optimum,
                                        predicted_outcomes)

    outcomes = predicted_outcomes(load_predictions(str(path)))
    if not outcomes:
        raise ReportError(f"'paper' --tune-v100: {path.name} has no predictions",
                          hint="python -m autotune.predicted_grid ... --simulate")
    key, best = predicted_optimum(outcomes)
    where = ", ".join(f"{k} {v:g}" for k, v in json.loads(key).items())
    oom = sum(o["status"] == "oom" for o in outcomes.values())
    return (f"{best['throughput']:.3g} samples/s at {where}; {oom} of {len(outcomes)} "
            "candidates predicted OOM *(predicted)*")


def _ablation_text(model: str, steps: List[tuple]) -> str:
    """``(label, samples/s or None, status, ranks)`` per step: how many steps are faster than
    the one before (the paper's claim), then each step's samples/s and speedup over vanilla."""
    vanilla = steps[0][1]
    faster = sum(1 for before, now in zip(steps, steps[1:])
                 if before[1] is not None and now[1] is not None and now[1] > before[1])
    parts = [f"{label} {value:.3g}" + (f" ({value / vanilla:.2f}x)" if vanilla and i else "")
             + f" (n={n})" if value is not None else f"{label} {status} (n={n})"
             for i, (label, value, status, n) in enumerate(steps)]
    return (f"{faster} of {len(steps) - 1} steps faster than the one before; `{model}`: "
            + ", ".join(parts))


def _ablation_cpu_text(path: Optional[Path]) -> str:
    """The measured ablation: medians of the interleaved rounds per step."""
    from end2end.results.ablation import summarise

    if path is None:
        return "not given"
    rows = result_rows(path)
    steps = [(r.step.label, r.median, ",".join(r.failed) or "no ok run", r.ranks)
             for r in summarise(rows)]
    return _ablation_text(rows[0].model, steps) + " (medians)"


def _ablation_v100_text(path: Path) -> str:
    """Each step of a simulated ablation: predicted samples/s, or its status."""
    from .predicted import simulated_steps

    steps = simulated_steps(path)
    return _ablation_text(steps[0][1].model, [
        (step.label, row.thrpt if row.status == "sim" else None, row.status, row.ngpu)
        for step, row in steps]) + " *(predicted)*"


@generator("paper")
def _paper(root: Path, args: Sequence[str]) -> str:
    files = _options(root, args)
    cpu, v100, fig8 = files["cpu"], files.get("v100"), files.get("fig8")
    best = _best_ratios(cpu)
    rows = [
        ("Max single-node speedup, best Slapo / best baseline (2 or more ranks)", "single",
         _max_text(best), _predicted(v100, lambda p: _max_text(_best_ratios(p)))),
        ("Slapo best on every model", "every", _every_text(best),
         _predicted(v100, lambda p: _every_text(_best_ratios(p)))),
        ("Slapo-TP / Megatron-LM", "tp", _tp_text(cpu), _predicted(v100, _tp_text)),
        ("Max multi-node speedup (16-64 GPUs)", "multi", "not measurable here (one machine)",
         _predicted(fig8, lambda p: _max_text(_best_ratios(p)))),
        ("Auto-tuning optimum (Figure 10)", "tune", _grid_text(files.get("grid")),
         _tune_v100_text(files["tune-v100"]) if "tune-v100" in files else "not simulated"),
    ]
    rows.append(("Progressive ablation (Figure 9), samples/s per step", "ablation",
                 _ablation_cpu_text(files.get("ablation")),
                 _ablation_v100_text(files["ablation-v100"]) if "ablation-v100" in files
                 else "not simulated"))
    lines = ["| Claim | Paper (V100) | This artifact, measured on CPU | Paper's machines, "
             "simulated |", "|---|---|---|---|"]
    lines += [f"| {claim} | {paper_value(key)} | {ours} | {sim} |"
              for claim, key, ours, sim in rows]
    sources = "\n".join(f"- {claim}: {PAPER[key][1]}." for claim, key, *_ in rows)
    marks = "; ".join(f"*({mark})*: {meaning}" for mark, meaning in MARKS.items()
                      if any(PAPER[key][2] == mark for _, key, *_ in rows))
    return "\n".join(lines) + (
        "\n\nMeasured ratios are medians of per-round ratios with their range (`~`: within "
        "noise); predictions come from the simulator (docs/simulate.md) and are never paired "
        "with a measurement. Only workloads of 2 or more ranks are compared (the paper's "
        "Figures 7 and 8 compare distributed systems). A paper value marked "
        f"{marks}. The paper's values:\n\n{sources}")
