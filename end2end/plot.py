"""Figure 7 from a results file: throughput per model, GPU/rank count and system.

    python -m end2end.plot results.tsv [more.tsv ...] -o fig7     # -> fig7.png, fig7.pdf

One panel per workload — (model, seq, dec seq): runs at other sequence lengths are never
compared — titled with the sequence length and batch size(s); x = GPU (rank) counts, one bar
per system (Megatron-LM, Slapo-TP, DeepSpeed, Slapo-ZeRO3, plus Eager / Slapo for CPU runs).
A bar is one (batch, ckpt) setting of that (system, workload, n): rows of one system at several
settings are refused, naming the clash, unless ``--best`` takes the max over them (each system
at its best batch and checkpointing, as the artifact's Figure 7 does). Systems may run at
different batch sizes (each its tuned one, as in the paper); the printed speedups then show both.
A coloured "X" marks a run that produced no throughput (oom/fail/timeout/skipped); a grey "x"
marks a system of the figure with no row there ("not run", e.g. no Megatron-LM RoBERTa): every
system of a group (the Figure-7 four; the CPU pair eager/Slapo) that appears anywhere in the
figure keeps its slot wherever its group runs, and its legend entry. A Slapo bar carries its
speedup over its baseline (Slapo-TP / Megatron-LM, Slapo-ZeRO3 / DeepSpeed, Slapo / Eager).
Speedups (those pairs and best Slapo vs best baseline) are printed. All numbers come from the
results file.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

from slapo.errors import ConfigError

from .results import ResultRow, read_results

__all__ = ["SYSTEMS", "Cell", "Panel", "PlotError", "figure7_table", "figure_systems",
           "speedups", "format_speedups", "make_figure", "plot_results", "main"]

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


class PlotError(ConfigError):
    """The rows cannot be drawn without comparing unlike runs."""


class Panel(NamedTuple):
    """One panel of the figure: a model at one sequence length (and decoder length)."""

    model: str
    seq: int
    dec_seq: int


@dataclass(frozen=True)
class Cell:
    """Best throughput of one (system, panel, n), or the status of its failed runs."""

    thrpt: Optional[float]
    status: str  # "ok" or the failure status (oom/fail/timeout/skipped)
    rows: int
    batch: int = 0  # the batch of the bar (of the best row with --best)
    settings: Tuple[Tuple[int, str], ...] = ()  # the (batch, ckpt) settings of its rows


Table = Dict[Panel, Dict[int, Dict[str, Cell]]]  # panel -> n -> impl -> cell


def figure7_table(rows: Iterable[ResultRow], best: bool = False) -> Table:
    """Aggregate rows per (panel, n, impl): the max throughput over ``ok`` rows of one setting;
    failures keep their status (``oom`` wins over other failures, as the most informative).
    Rows of one (panel, n, impl) at different (batch, ckpt) settings raise :class:`PlotError`
    unless ``best`` (then the bar is the best setting)."""
    table: Table = {}
    for row in rows:
        panel = Panel(row.model, row.seq, row.dec_seq)
        per_n = table.setdefault(panel, {}).setdefault(row.ngpu, {})
        old = per_n.get(row.impl)
        setting = (row.batch, str(row.ckpt))
        settings = tuple(sorted(set(old.settings if old else ()) | {setting}))
        if len(settings) > 1 and not best:
            shown = " and ".join(f"batch {b} ckpt {c}" for b, c in settings)
            raise PlotError(f"{_LABEL.get(row.impl, row.impl)} {row.model} seq {row.seq} "
                            f"n={row.ngpu} has rows at {shown}: one bar cannot show both",
                            hint="plot one setting (--models, or separate results files), or "
                                 "pass --best to take each system's best setting as the "
                                 "paper's Figure 7 does")
        count = (old.rows if old else 0) + 1
        if row.status == "ok" and row.thrpt is not None:
            if old and old.thrpt is not None and old.thrpt >= row.thrpt:
                per_n[row.impl] = Cell(old.thrpt, "ok", count, old.batch, settings)
            else:
                per_n[row.impl] = Cell(row.thrpt, "ok", count, row.batch, settings)
        elif old is None or old.thrpt is None:
            status = "oom" if "oom" in (row.status, old.status if old else "") else row.status
            per_n[row.impl] = Cell(None, status, count, row.batch, settings)
        else:
            per_n[row.impl] = Cell(old.thrpt, "ok", count, old.batch, settings)
    return table


def figure_systems(table: Table) -> List[str]:
    """Every system of the figure: all members of each group (``GROUPS``) that has a row
    anywhere, then systems outside the groups; each keeps its slot and legend entry."""
    present = {impl for per_n in table.values() for cells in per_n.values() for impl in cells}
    keep = set(present)
    for group in GROUPS:
        if present & set(group):
            keep |= set(group)
    known = [impl for impl, _, _ in SYSTEMS if impl in keep]
    return known + sorted(keep - set(known))


def _panel_systems(cells: Dict[str, Cell], systems: List[str]) -> List[str]:
    """The systems with a slot at one GPU count of a panel: every group that runs there."""
    present = set(cells)
    keep = set(present)
    for group in GROUPS:
        if present & set(group):
            keep |= set(group)
    return [impl for impl in systems if impl in keep]


def _batches(cells: Iterable[Cell]) -> str:
    values = sorted({b for c in cells for b, _ in c.settings})
    if not values:
        return ""
    return f"bs {values[0]}" if len(values) == 1 else f"bs {values[0]}-{values[-1]}"


def panel_title(panel: Panel, per_n: Dict[int, Dict[str, Cell]]) -> str:
    """``BERT (CPU) · seq 256 · bs 4`` (T5: ``seq 256/128``)."""
    seq = f"seq {panel.seq}" + (f"/{panel.dec_seq}" if panel.dec_seq else "")
    batch = _batches(c for cells in per_n.values() for c in cells.values())
    return " · ".join(x for x in (_model_label(panel.model), seq, batch) if x)


def _model_label(name: str) -> str:
    try:
        from .models import get_model_spec

        return get_model_spec(name).label
    except (ImportError, LookupError):  # no torch here, or a model not in the zoo
        return name


def speedups(table: Table) -> List[Tuple[Panel, int, str, str, float]]:
    """``(panel, n, system, baseline, ratio)`` for every pair with two throughputs in one
    panel (same model and sequence lengths), including ``best-slapo`` vs ``best-baseline``
    (the artifact's conclusion)."""
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


def format_speedups(items: Sequence[Tuple[Panel, int, str, str, float]],
                    table: Optional[Table] = None) -> str:
    """One line per speedup; with ``table``, the two batch sizes when they differ."""
    lines = []
    for panel, n, num, den, ratio in items:
        seq = f"seq {panel.seq}" + (f"/{panel.dec_seq}" if panel.dec_seq else "")
        line = (f"{_model_label(panel.model)} {seq} n={n}: {_LABEL.get(num, num)} / "
                f"{_LABEL.get(den, den)} = {ratio:.2f}x")
        cells = table[panel][n] if table else {}
        if num in cells and den in cells and cells[num].batch != cells[den].batch:
            line += f" (batch {cells[num].batch} vs {cells[den].batch})"
        lines.append(line)
    return "\n".join(lines)


def make_figure(table: Table, x_label: str = "# GPUs", title: str = ""):
    """A matplotlib Figure: one bar panel per model (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(table)
    systems = figure_systems(table)
    ncols = min(3, max(1, len(models)))
    nrows = max(1, math.ceil(len(models) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows + 0.6),
                             squeeze=False)
    for ax, model in zip(axes.flat, models):
        ns = sorted(table[model])
        slots = {n: _panel_systems(table[model][n], systems) for n in ns}
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
        ax.set_title(panel_title(model, table[model]), fontsize=9)
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
    labels += ["OOM / failed", "not run"]
    height = 3.0 * nrows + 0.6
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 8), frameon=False,
               fontsize=8, bbox_to_anchor=(0.5, 1.0))
    if title:
        fig.text(0.5, 0.005, title, ha="center", va="bottom", fontsize=8)
    fig.tight_layout(rect=(0, 0.25 / height if title else 0, 1, 1 - 0.4 / height))
    return fig


def plot_results(paths: Sequence[Union[str, Path]], out_prefix: Union[str, Path],
                 models: Optional[Sequence[str]] = None, title: str = "", best: bool = False):
    """Read results file(s), write ``<out_prefix>.png`` and ``.pdf``; return (table, speedups,
    [png, pdf]). Damaged lines are skipped with a ``file:line`` warning; no rows, or rows that
    would put unlike runs in one bar (see :func:`figure7_table`), raise :class:`PlotError`."""
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
        raise PlotError(f"no rows to plot in {', '.join(map(str, paths))}"
                        + (f" for the models {', '.join(models)}" if models else ""),
                        hint="run the sweep first (end2end/README.md), or check --models")
    table = figure7_table(rows, best=best)
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


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m end2end.plot`` command line (every option documented)."""
    from .cli import HelpFormatter

    p = argparse.ArgumentParser(
        prog="python -m end2end.plot", formatter_class=HelpFormatter,
        description="Plot Figure 7 (throughput per model, GPU count and system) from results "
                    "files only, and print the Slapo speedups. Exit status 2 (one line) when "
                    "there is nothing to plot or unlike runs would share a bar.")
    p.add_argument("results", nargs="+", help="results TSV file(s) written by end2end.sweep")
    p.add_argument("-o", "--output", default="fig7",
                   help="output prefix: writes PREFIX.png and PREFIX.pdf")
    p.add_argument("--models", nargs="*", help="only these models (zoo names, as in the "
                   "config; default: all)")
    p.add_argument("--title", default="", help="caption under the figure, e.g. the machine")
    p.add_argument("--best", action="store_true",
                   help="a system with rows at several batch/ckpt settings of one workload "
                        "and GPU count gets its best one (the paper's Figure 7); default: "
                        "refuse, naming the clash")
    p.add_argument("--debug", action="store_true", help="full traceback of an error")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status."""
    from .cli import report_errors

    args = build_parser().parse_args(argv)

    def run() -> int:
        table, items, files = plot_results(args.results, args.output, args.models,
                                           args.title, args.best)
        print(format_speedups(items, table)
              or "no comparable pairs (need two systems with throughput)")
        print("wrote " + ", ".join(map(str, files)))
        return 0

    return report_errors("end2end.plot", run, args.debug)


if __name__ == "__main__":
    sys.exit(main())
