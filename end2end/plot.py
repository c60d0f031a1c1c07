"""Figure 7 from a results file: throughput per model, GPU/rank count and system.

    python -m end2end.plot results.tsv [more.tsv ...] -o fig7     # -> fig7.png, fig7.pdf

One panel per model (in order of first appearance), x = GPU (rank) counts, one bar per system
(Megatron-LM, Slapo-TP, DeepSpeed, Slapo-ZeRO3, plus Eager / Slapo for CPU runs). A bar is the
**max** throughput over the rows of that (system, model, n) — i.e. over checkpoint settings and
batch sizes, as in the artifact. A coloured "X" marks a run that produced no throughput
(oom/fail/timeout/skipped); a grey "x" marks a system that has no row there at all (e.g. no
Megatron-LM model for RoBERTa). At each GPU count a panel has slots only for the system groups
(Figure-7 four, eager/Slapo pair) run there; a Slapo bar carries its speedup over its baseline
(Slapo-TP / Megatron-LM, Slapo-ZeRO3 / DeepSpeed, Slapo / Eager). Speedups (those pairs and
best Slapo vs best baseline) are printed. All numbers come from the results file.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .results import ResultRow, read_results

__all__ = ["SYSTEMS", "Cell", "figure7_table", "speedups", "format_speedups", "make_figure",
           "plot_results", "main"]

# (impl, legend label, colour)
SYSTEMS: Tuple[Tuple[str, str, str], ...] = (
    ("megatron", "Megatron-LM", "#4c72b0"),
    ("slapo-megatron", "Slapo-TP", "#dd8452"),
    ("deepspeed", "DeepSpeed", "#55a868"),
    ("slapo-deepspeed", "Slapo-ZeRO3", "#c44e52"),
    ("eager", "Eager", "#8172b3"),
    ("slapo", "Slapo", "#937860"),
)
# Panels show a group of systems when the model has a row of any system in it (then a missing
# member, e.g. Megatron-LM for RoBERTa, gets a grey "x"): the Figure-7 four, and the CPU pair.
GROUPS = (("megatron", "slapo-megatron", "deepspeed", "slapo-deepspeed"), ("eager", "slapo"))
PAIRS = (("slapo-megatron", "megatron"), ("slapo-deepspeed", "deepspeed"), ("slapo", "eager"))
BASELINES = ("megatron", "deepspeed", "eager")
_LABEL = {impl: label for impl, label, _ in SYSTEMS}
_PAIR_BASE = dict(PAIRS)  # a Slapo system's bar is labelled with its speedup over this baseline
_COLOR = {impl: color for impl, _, color in SYSTEMS}


@dataclass(frozen=True)
class Cell:
    """Best throughput of one (system, model, n), or the status of its failed runs."""

    thrpt: Optional[float]
    status: str  # "ok" or the failure status (oom/fail/timeout/skipped)
    rows: int


Table = Dict[str, Dict[int, Dict[str, Cell]]]  # model -> n -> impl -> cell


def figure7_table(rows: Iterable[ResultRow]) -> Table:
    """Aggregate rows: max throughput over ``ok`` rows per (model, n, impl); failures keep their
    status (``oom`` wins over other failures, as the most informative)."""
    table: Table = {}
    for row in rows:
        per_n = table.setdefault(row.model, {}).setdefault(row.ngpu, {})
        old = per_n.get(row.impl)
        count = (old.rows if old else 0) + 1
        if row.status == "ok" and row.thrpt is not None:
            best = max(row.thrpt, old.thrpt) if old and old.thrpt is not None else row.thrpt
            per_n[row.impl] = Cell(best, "ok", count)
        elif old is None or old.thrpt is None:
            status = "oom" if "oom" in (row.status, old.status if old else "") else row.status
            per_n[row.impl] = Cell(None, status, count)
        else:
            per_n[row.impl] = Cell(old.thrpt, "ok", count)
    return table


def _systems(table: Table) -> List[str]:
    present = {impl for per_n in table.values() for cells in per_n.values() for impl in cells}
    known = [impl for impl, _, _ in SYSTEMS if impl in present]
    return known + sorted(present - set(known))


def _panel_systems(per_n: Dict[int, Dict[str, Cell]], systems: List[str]) -> List[str]:
    """The systems that get a slot in one model's panel (see ``GROUPS``)."""
    present = {impl for cells in per_n.values() for impl in cells}
    keep = set(present)
    for group in GROUPS:
        if present & set(group):
            keep |= set(group)
    return [impl for impl in systems if impl in keep]


def _model_label(name: str) -> str:
    try:
        from .models import get_model_spec

        return get_model_spec(name).label
    except (ImportError, LookupError):  # no torch here, or a model not in the zoo
        return name


def speedups(table: Table) -> List[Tuple[str, int, str, str, float]]:
    """``(model, n, system, baseline, ratio)`` for every comparable pair with two throughputs,
    including ``best-slapo`` vs ``best-baseline`` (the artifact's conclusion)."""
    out = []
    for model, per_n in table.items():
        for n in sorted(per_n):
            cells = per_n[n]

            def thr(impl: str, cells=cells) -> Optional[float]:
                cell = cells.get(impl)
                return cell.thrpt if cell else None

            for num, den in PAIRS:
                a, b = thr(num), thr(den)
                if a is not None and b:
                    out.append((model, n, num, den, a / b))
            slapo = [t for i, c in cells.items() if i.startswith("slapo")
                     for t in [c.thrpt] if t is not None]
            base = [t for i in BASELINES for t in [thr(i)] if t]
            if slapo and base:
                out.append((model, n, "best-slapo", "best-baseline", max(slapo) / max(base)))
    return out


def format_speedups(items: Sequence[Tuple[str, int, str, str, float]]) -> str:
    lines = []
    for model, n, num, den, ratio in items:
        lines.append(f"{_model_label(model)} n={n}: {_LABEL.get(num, num)} / "
                     f"{_LABEL.get(den, den)} = {ratio:.2f}x")
    return "\n".join(lines)


def make_figure(table: Table, x_label: str = "# GPUs", title: str = ""):
    """A matplotlib Figure: one bar panel per model (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(table)
    systems = _systems(table)
    ncols = min(3, max(1, len(models)))
    nrows = max(1, math.ceil(len(models) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows + 0.6),
                             squeeze=False)
    for ax, model in zip(axes.flat, models):
        ns = sorted(table[model])
        slots = {n: _panel_systems({n: table[model][n]}, systems) for n in ns}
        width = 0.8 / max(1, max(len(v) for v in slots.values()))
        peak = max((c.thrpt for per in table[model].values() for c in per.values()
                    if c.thrpt is not None), default=1.0)
        for x, n in enumerate(ns):
            cells, panel = table[model][n], slots[n]
            for s_idx, impl in enumerate(panel):
                cell = cells.get(impl)
                pos = x + (s_idx - (len(panel) - 1) / 2) * width
                if cell is not None and cell.thrpt is not None:
                    ax.bar(pos, cell.thrpt, width, color=_COLOR.get(impl, "#777777"))
                    base = _PAIR_BASE.get(impl)
                    ref = cells.get(base) if base else None
                    if ref is not None and ref.thrpt:
                        ax.annotate(f"{cell.thrpt / ref.thrpt:.2f}x", (pos, cell.thrpt),
                                    xytext=(0, 2), textcoords="offset points", ha="center",
                                    va="bottom", fontsize=7)
                elif cell is not None:  # ran, no throughput
                    ax.plot(pos, 0.04 * peak, marker="x", markersize=9, markeredgewidth=2.5,
                            color=_COLOR.get(impl, "#777777"), linestyle="none")
                else:  # no row: unsupported / not run
                    ax.plot(pos, 0.04 * peak, marker="x", markersize=5, markeredgewidth=1,
                            color="#aaaaaa", linestyle="none")
        ax.set_xticks(range(len(ns)))
        ax.set_xticklabels([str(n) for n in ns])
        ax.set_title(_model_label(model))
        ax.set_xlabel(x_label)
        ax.set_ylabel("samples/s")
        ax.set_ylim(0, peak * 1.2)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(models):]:
        ax.set_visible(False)
    from matplotlib.lines import Line2D

    handles = [plt.Rectangle((0, 0), 1, 1, color=_COLOR.get(i, "#777777")) for i in systems]
    labels = [_LABEL.get(i, i) for i in systems]
    handles += [Line2D([], [], marker="x", color="#333333", linestyle="none", markersize=8,
                       markeredgewidth=2.5),
                Line2D([], [], marker="x", color="#aaaaaa", linestyle="none", markersize=5)]
    labels += ["OOM / failed", "not supported / not run"]
    height = 3.0 * nrows + 0.6
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 8), frameon=False,
               fontsize=8, bbox_to_anchor=(0.5, 1.0))
    if title:
        fig.text(0.5, 0.005, title, ha="center", va="bottom", fontsize=8)
    fig.tight_layout(rect=(0, 0.25 / height if title else 0, 1, 1 - 0.4 / height))
    return fig


def plot_results(paths: Sequence[Union[str, Path]], out_prefix: Union[str, Path],
                 models: Optional[Sequence[str]] = None, title: str = ""):
    """Read results file(s), write ``<out_prefix>.png`` and ``.pdf``; return (table, speedups,
    [png, pdf])."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["pdf.fonttype"] = 42  # editable text, as the artifact's figures
    rows: List[ResultRow] = []
    devices = set()
    for path in paths:
        res = read_results(path)
        for warning in res.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        rows += res.rows
        devices |= {r.device for r in res.rows}
    if models:
        rows = [r for r in rows if r.model in models]
    if not rows:
        raise SystemExit(f"no rows to plot in {', '.join(map(str, paths))}")
    table = figure7_table(rows)
    on_cpu = devices and all(d.lower().startswith("cpu") for d in devices)
    fig = make_figure(table, x_label="# ranks" if on_cpu else "# GPUs", title=title)
    out = Path(out_prefix)
    if out.suffix in (".png", ".pdf"):
        out = out.with_suffix("")
    out.parent.mkdir(parents=True, exist_ok=True)
    files = [Path(f"{out}.png"), Path(f"{out}.pdf")]
    for f in files:
        fig.savefig(f, dpi=150, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return table, speedups(table), files


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Plot Figure 7 from benchmark results.")
    parser.add_argument("results", nargs="+", help="results TSV file(s)")
    parser.add_argument("-o", "--output", default="fig7", help="output prefix (.png/.pdf)")
    parser.add_argument("--models", nargs="*", help="only these models (config names)")
    parser.add_argument("--title", default="", help="caption, e.g. the machine")
    args = parser.parse_args(argv)
    _, items, files = plot_results(args.results, args.output, args.models, args.title)
    print(format_speedups(items) or "no comparable pairs (need two systems with throughput)")
    print("wrote " + ", ".join(map(str, files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
