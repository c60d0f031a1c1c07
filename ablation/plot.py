"""Figure 9 from an ablation results file: one horizontal bar per step, median with min-max.

    python -m ablation.plot results/ablation-bert.tsv -o results/ablation-bert   # .png, .pdf
    python -m ablation.plot results/ablation-bert.tsv --table                    # Markdown

Every ``ok`` row of the file is one measurement of one step (:func:`ablation.steps.step_of`);
repeats of a step (the sweep's interleaved rounds) give its median and min-max. The left panel
is the total throughput (samples/s over all ranks) with each step's speedup over vanilla HF; the
right panel the throughput per rank (GPU), which separates optimisation from scale-out (the
paper's steps 1-2 run on one GPU, 3-5 on eight). A step whose range overlaps the previous
step's is marked "~" (within the noise of the machine). A step with rows but no ``ok`` run shows
its status instead of a bar. Nothing is drawn from anywhere but the file.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from end2end.results.store import ResultRow, read_results

from .steps import AblationError, Step, step_of

__all__ = ["StepResult", "summarise", "format_table", "make_figure", "main"]


@dataclass
class StepResult:
    """The measurements of one step: the run's identity, throughputs (samples/s) of its ok
    repeats, and the statuses of those that were not ok."""

    step: Step
    run: Tuple
    ranks: int
    thrpt: List[float] = field(default_factory=list)
    failed: List[str] = field(default_factory=list)

    @property
    def median(self) -> Optional[float]:
        return statistics.median(self.thrpt) if self.thrpt else None

    @property
    def range(self) -> Tuple[float, float]:
        return min(self.thrpt), max(self.thrpt)

    def per_rank(self, value: float) -> float:
        return value / self.ranks


def _identity(row: ResultRow) -> Tuple:
    """What must be equal for two rows to be repeats of one run (the key without the repeat)."""
    return row.key[:-1]


def summarise(rows: Sequence[ResultRow]) -> List[StepResult]:
    """The steps present in ``rows``, in step order. Refuses rows of several models, rows that
    are no step, and two different runs for one step (e.g. two batch sizes)."""
    models = sorted({r.model for r in rows})
    if len(models) > 1:
        raise AblationError(f"rows of several models ({', '.join(models)}): one ablation "
                            "results file per model")
    out: Dict[int, StepResult] = {}
    for row in rows:
        step = step_of(row)
        res = out.setdefault(step.index, StepResult(step, _identity(row), row.ngpu))
        if res.run != _identity(row):
            raise AblationError(f"two different runs for step '{step.label}': {res.run} and "
                                f"{_identity(row)}; keep one per results file")
        if row.status == "ok":
            res.thrpt.append(row.thrpt)
        else:
            res.failed.append(row.status)
    return [out[i] for i in sorted(out)]


def _overlaps(a: StepResult, b: StepResult) -> bool:
    return bool(a.thrpt and b.thrpt) and a.range[0] <= b.range[1] and b.range[0] <= a.range[1]


def format_table(results: Sequence[StepResult]) -> str:
    """A Markdown table: per step its run, samples/s (median, min-max, repeats), per rank, and
    the speedup of the medians over vanilla HF."""
    base = results[0].median if results and results[0].step.index == 0 else None
    lines = ["| Step | Run | samples/s, median (min-max) | per rank | vs vanilla |",
             "|---|---|---:|---:|---:|"]
    for r in results:
        mode, _, seq, _, n, batch, ckpt, _, knobs = r.run
        run = f"`{mode}` n={n} bs={batch} seq={seq}" + (f" ckpt={ckpt}" if ckpt != "0" else "")
        run += f" `{knobs}`" if knobs else ""
        if r.median is None:
            lines.append(f"| {r.step.label} | {run} | {', '.join(r.failed)} | - | - |")
            continue
        lo, hi = r.range
        ratio = f"{r.median / base:.2f}x" if base else "-"
        lines.append(f"| {r.step.label} | {run} | {r.median:.3g} ({lo:.3g}-{hi:.3g}, "
                     f"{len(r.thrpt)}x) | {r.per_rank(r.median):.3g} | {ratio} |")
    return "\n".join(lines)


def _label(results: Sequence[StepResult], i: int, base: Optional[float]) -> str:
    r = results[i]
    text = f"{r.median / base:.2f}x" if base else ""
    if i and _overlaps(r, results[i - 1]):
        text += " ~"
    return text


def make_figure(results: Sequence[StepResult], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 0.6 * len(results) + 1.6), sharey=True)
    ys = list(range(len(results)))[::-1]  # vanilla on top
    base = results[0].median if results and results[0].step.index == 0 else None
    for ax, per_rank in zip(axes, (False, True)):
        for i, (y, r) in enumerate(zip(ys, results)):
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
                ax.text(hi, y, "  " + _label(results, i, base), va="center")
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
    args = p.parse_args(argv)
    res = read_results(args.results)
    for warning in res.warnings:
        print(f"ablation.plot: warning: {warning}", file=sys.stderr)
    try:
        results = summarise(res.rows)
    except AblationError as exc:
        print(f"ablation.plot: {args.results}: {exc}", file=sys.stderr)
        return 2
    if not results:
        print(f"ablation.plot: {args.results}: no rows", file=sys.stderr)
        return 2
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
    print(f"ablation.plot: wrote {out}.png and {out}.pdf")
    return 0


if __name__ == "__main__":
    sys.exit(main())
