"""Figure 7 from a results file: throughput per model, GPU/rank count and system.

    python -m end2end.plot results.tsv [more.tsv ...] -o fig7     # -> fig7.png, fig7.pdf
    python -m end2end.plot peers.tsv --peers -o peers             # the PyTorch peers figure

One panel per workload — (model, seq, dec seq): runs at other sequence lengths are never
compared — titled with the sequence length and batch size(s); x = GPU (rank) counts, one bar
per system (Megatron-LM, Slapo-TP, DeepSpeed, Slapo-ZeRO3, plus Eager / Slapo for CPU runs).
A bar is one (batch, ckpt) setting of that (system, workload, n): rows of one system at several
settings are refused, naming the clash, unless ``--best`` takes the best of them (each system
at its best batch and checkpointing, as the artifact's Figure 7 does). Repeats of a run (the
sweep's interleaved rounds, ``--repeat``) make one bar: the median, with a min-max whisker.
Systems may run at different batch sizes (each its tuned one, as in the paper); the printed
speedups then show both.
A coloured "X" marks a run that produced no throughput (oom/fail/timeout/skipped); a grey "x"
marks a system of the figure with no row there ("not run", e.g. no Megatron-LM RoBERTa): every
system of a group (the Figure-7 four; the CPU pair eager/Slapo) that appears anywhere in the
figure keeps its slot wherever its group runs, and its legend entry. A Slapo bar carries its
speedup over its baseline (Slapo-TP / Megatron-LM, Slapo-ZeRO3 / DeepSpeed, Slapo / Eager),
the median of the per-round ratios (of the medians when rounds do not pair up), or "~" when it
is within noise (the per-round ratios of interleaved
repeats include 1.0; :mod:`end2end.results.stats`). Speedups (those pairs and best Slapo vs best
baseline; medians with ranges) are printed. All numbers come from the results file
(aggregation: :mod:`end2end.results.summary`).

``--peers`` draws the same kind of figure for today's PyTorch peers (configs/*_peers.cfg): only
the rows of FSDP2, Slapo-FSDP2, DTensor-TP and Slapo-TP, with the speedups Slapo-FSDP2 / FSDP2
and Slapo-TP / DTensor-TP.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Union

from end2end.cli import get_logger
from end2end.results.store import ResultRow, read_results
from end2end.results.summary import (COLOR, GROUPS, PEER_GROUPS, SYSTEMS, Cell, Panel,
                                     PlotError, Table, base_system, baselines_of,
                                     figure7_table, figure_systems, is_predicted, format_markdown,
                                     format_speedups, label_of, panel_systems, panel_title,
                                     speedups)

__all__ = ["SYSTEMS", "Cell", "Panel", "PlotError", "figure7_table", "figure_systems",
           "speedups", "format_speedups", "make_figure", "plot_results", "main"]


def _pair_base(cells, impl: str) -> Optional[Cell]:
    """The baseline a Slapo bar's speedup is over: its first pair (``PAIRS``) with a bar here
    (a run with knobs, ``slapo [k=v]``, is compared like its mode)."""
    return next((cells[base] for base in baselines_of(impl) if base in cells), None)


def _color(system: str) -> str:
    return COLOR.get(base_system(system), "#777777")


def _bar(ax, pos: float, width: float, impl: str, cell: Cell, ref: Optional[Cell]) -> None:
    """A bar at the median, a min-max whisker when repeated, and a Slapo bar's speedup over its
    baseline (``~`` when within noise, :meth:`end2end.results.stats.Samples.ratio`)."""
    knobs = impl != base_system(impl)  # a knob variant: its mode's colour, hatched
    ax.bar(pos, cell.thrpt, width, color=_color(impl), hatch="//" if knobs else None,
           edgecolor="white" if knobs else None)
    top = cell.thrpt
    if len(cell.samples) > 1:
        ax.errorbar(pos, cell.thrpt, yerr=[[cell.thrpt - cell.samples.lo],
                                           [cell.samples.hi - cell.thrpt]],
                    fmt="none", ecolor="#222222", elinewidth=0.8, capsize=2)
        top = cell.samples.hi
    if ref is not None and ref.thrpt:
        ax.annotate(cell.samples.ratio(ref.samples).label, (pos, top), xytext=(0, 2),
                    textcoords="offset points", ha="center", va="bottom", fontsize=7)


def make_figure(table: Table, x_label: str = "# GPUs", title: str = "", groups=GROUPS,
                predicted: bool = False):
    """A matplotlib Figure: one bar panel per model (see the module docstring); ``predicted``:
    simulated rows, every system's legend entry says "(predicted)"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(table)
    systems = figure_systems(table, groups)
    ncols = min(3, max(1, len(models)))
    nrows = max(1, math.ceil(len(models) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows + 0.6),
                             squeeze=False)
    for ax, model in zip(axes.flat, models):
        ns = sorted(table[model])
        slots = {n: panel_systems(table[model][n], systems, groups) for n in ns}
        width = 0.8 / max(1, max(len(v) for v in slots.values()))
        peak = max((c.samples.hi for per in table[model].values() for c in per.values()
                    if c.thrpt is not None), default=1.0)
        for x, n in enumerate(ns):
            cells, panel = table[model][n], slots[n]
            for s_idx, impl in enumerate(panel):
                cell = cells.get(impl)
                pos = x + (s_idx - (len(panel) - 1) / 2) * width
                if cell is not None and cell.thrpt is not None:
                    _bar(ax, pos, width, impl, cell, _pair_base(cells, impl))
                elif cell is not None:  # ran, no throughput
                    ax.plot(pos, 0.04 * peak, marker="x", markersize=9, markeredgewidth=2.5,
                            color=_color(impl), linestyle="none")
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

    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=_color(i), edgecolor="white",
                             hatch="//" if i != base_system(i) else None) for i in systems]
    labels = [label_of(i) + (" (predicted)" if predicted else "") for i in systems]
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
                 models: Optional[Sequence[str]] = None, title: str = "", best: bool = False,
                 peers: bool = False):
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
            get_logger("end2end.plot").warning("warning: %s", warning)
        rows += res.rows
        devices |= {r.device for r in res.rows}
    if models:
        rows = [r for r in rows if r.model in models]
    if peers:  # the peers figure: only its systems
        rows = [r for r in rows if r.impl in PEER_GROUPS[0]]
    if not rows:
        raise PlotError(f"no rows to plot in {', '.join(map(str, paths))}"
                        + (f" for the models {', '.join(models)}" if models else ""),
                        hint="run the sweep first (end2end/README.md), or check --models")
    table = figure7_table(rows, best=best)
    if is_predicted(rows):  # simulated rows: every figure says so
        title = f"{title} (predicted)".strip()
    on_cpu = devices and all(d.lower().startswith("cpu") for d in devices)
    fig = make_figure(table, x_label="# ranks" if on_cpu else "# GPUs", title=title,
                      groups=PEER_GROUPS if peers else GROUPS, predicted=is_predicted(rows))
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
    from end2end.cli import HelpFormatter

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
    p.add_argument("--peers", action="store_true",
                   help="the PyTorch peers figure: only FSDP2 / Slapo-FSDP2 / DTensor-TP / "
                        "Slapo-TP rows (configs/*_peers.cfg)")
    p.add_argument("--table", action="store_true",
                   help="also print a Markdown table: samples/s median (min-max) per system, "
                        "and the speedups with their ranges (as in end2end/README.md)")
    p.add_argument("--debug", action="store_true", help="full traceback of an error")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status."""
    from end2end.cli import configure_logging, report_errors

    args = build_parser().parse_args(argv)
    configure_logging()

    def run() -> int:
        table, items, files = plot_results(args.results, args.output, args.models,
                                           args.title, args.best, args.peers)
        print(format_speedups(items, table)
              or "no comparable pairs (need two systems with throughput)")
        if args.table:
            print("\n" + format_markdown(table, items, PEER_GROUPS if args.peers else GROUPS))
        get_logger("end2end.plot").info("wrote %s", ", ".join(map(str, files)))
        return 0

    return report_errors("end2end.plot", run, args.debug)


if __name__ == "__main__":
    sys.exit(main())
