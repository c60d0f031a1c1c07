"""Figure 9 from an ablation results file: one horizontal bar per step, median with min-max.

    python -m ablation.plot results/ablation-bert.tsv -o results/ablation-bert   # .png, .pdf
    python -m ablation.plot results/ablation-bert.tsv --table                    # Markdown

Every ``ok`` row of the file is one measurement of one step; repeats of a step (the sweep's
interleaved rounds) give its median and min-max (:mod:`end2end.results.ablation` reads the file
into steps, below the report that tabulates them too). The left panel
is the total throughput (samples/s over all ranks) with each step's speedup over vanilla HF; the
right panel the throughput per rank (GPU), which separates optimisation from scale-out (the
paper's steps 1-2 run on one GPU, 3-5 on eight). A step whose range overlaps the previous
step's is marked "~" (within the noise of the machine). A step with rows but no ``ok`` run shows
its status instead of a bar. Nothing is drawn from anywhere but the file.

A results file that cannot be read, has no rows, or holds rows that are no step of the
ablation (or two runs for one step, or several models) is one line on stderr,
``ablation.plot: error: FILE: what. Hint: ...``, and exit status 2 (``--debug``: the traceback).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from slapo.errors import ConfigError

from end2end.cli import configure_logging, get_logger, report_errors
from end2end.results.ablation import AblationError, StepResult, format_table, summarise
from end2end.results.store import read_results

__all__ = ["make_figure", "main"]

log = get_logger("ablation.plot")


def _label(r: StepResult) -> str:
    text = f"{r.vs_vanilla:.2f}x" if r.vs_vanilla is not None else ""
    return text + (" ~" if r.within_noise else "")


def make_figure(results: Sequence[StepResult], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 0.6 * len(results) + 1.6), sharey=True)
    ys = list(range(len(results)))[::-1]  # vanilla on top
    for ax, per_rank in zip(axes, (False, True)):
        for y, r in zip(ys, results):
            if r.median is None:
                ax.text(0, y, "  X " + ", ".join(sorted(set(r.failed))), va="center",
                        color="#c44e52")
                continue
            scale = r.ranks if per_rank else 1
            med, (lo, hi) = r.median / scale, (v / scale for v in r.range)
            ax.barh(y, med, color="#dd8452" if r.step.index else "#8172b3", height=0.6)
            ax.errorbar(med, y, xerr=[[med - lo], [hi - med]], fmt="none", ecolor="black",
                        capsize=3, lw=1)
            if not per_rank:
                ax.text(hi, y, "  " + _label(r), va="center")
            else:
                ax.text(hi, y, f"  n={r.ranks}", va="center", color="#555555")
        ax.set_xlabel("samples/s per rank" if per_rank else "samples/s (all ranks)")
        ax.grid(axis="x", alpha=0.3)
        ax.margins(x=0.25)
    axes[0].set_yticks(ys, [r.step.label for r in results])
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ablation.plot",
                                description="Figure 9 (progressive ablation) from a results "
                                "file: bar chart (median, min-max) and/or a Markdown table.")
    p.add_argument("results", help="the ablation's results TSV (one model)")
    p.add_argument("-o", "--output", default=None,
                   help="write OUTPUT.png and OUTPUT.pdf (default: the results path without "
                   ".tsv)")
    p.add_argument("--title", default=None, help="figure title (default: model and device)")
    p.add_argument("--table", action="store_true", help="print the Markdown table only")
    p.add_argument("--debug", action="store_true", help="full traceback of an error")
    args = p.parse_args(argv)
    configure_logging()
    return report_errors("ablation.plot", lambda: _plot(args), args.debug)


def _plot(args: argparse.Namespace) -> int:
    res = read_results(args.results)
    for warning in res.warnings:
        log.warning("warning: %s", warning)
    try:
        results = summarise(res.rows)
    except AblationError as exc:
        raise ConfigError(f"{args.results}: {exc}",
                          hint="give the results file of one ablation config "
                          "(bash ablation/run.sh writes results/ablation-<model>.tsv)") from None
    if not results:
        raise ConfigError(f"{args.results}: no rows",
                          hint="run the ablation first: bash ablation/run.sh")
    print(format_table(results))
    if args.table:
        return 0
    out = Path(args.output or str(Path(args.results).with_suffix("")))
    model = res.rows[0].model
    device = res.env.get("device_name") or res.rows[0].device or "?"
    fig = make_figure(results, args.title or f"Progressive optimisation of {model} ({device}); "
                      "median, min-max over repeats")
    for ext in ("png", "pdf"):
        fig.savefig(out.with_suffix(f".{ext}"), dpi=120)
    log.info("wrote %s.png and %s.pdf", out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
