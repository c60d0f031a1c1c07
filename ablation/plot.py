"""Figure 9 from an ablation results file: one horizontal bar per step, median with min-max.

    python -m ablation.plot results/ablation-bert.tsv -o results/ablation-bert   # .png, .pdf
    python -m ablation.plot results/ablation-bert.tsv --table                    # Markdown

Every ``ok`` row of the file is one measurement of one step (:func:`ablation.steps.step_of`);
repeats of a step (the sweep's interleaved rounds) give its median and min-max (a pandas
groupby over the rows' DataFrame, :func:`summarise`). The left panel
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
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import pandas as pd

from slapo.errors import ConfigError

from end2end.cli import configure_logging, get_logger, report_errors
from end2end.results.stats import to_frame
from end2end.results.store import ResultRow, read_results

from .steps import STEPS, AblationError, Step, step_of

__all__ = ["StepResult", "summarise", "format_table", "make_figure", "main"]

log = get_logger("ablation.plot")


@dataclass
class StepResult:
    """One step: its run's identity and ranks; the median and min-max (samples/s) of its ok
    repeats and how many they are (``median`` None: none is ok); the statuses of the repeats
    that were not ok; the median's speedup over vanilla HF (None: no vanilla median) and
    whether its range overlaps the previous step's (within noise)."""

    step: Step
    run: Tuple
    ranks: int
    median: Optional[float] = None
    lo: Optional[float] = None
    hi: Optional[float] = None
    repeats: int = 0
    failed: List[str] = field(default_factory=list)
    vs_vanilla: Optional[float] = None
    within_noise: bool = False

    @property
    def range(self) -> Tuple[float, float]:
        return self.lo, self.hi

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
    frame = to_frame(rows).assign(Step=[step_of(r).index for r in rows],
                                  Run=[_identity(r) for r in rows])
    _refuse_two_runs(frame)
    summary = _step_frame(frame)
    return [StepResult(STEPS[i], s.Run, int(s.Ranks), _number(s.Median), _number(s.Lo),
                       _number(s.Hi), int(s.Repeats), s.Failed, _number(s.VsVanilla),
                       bool(s.WithinNoise)) for i, s in summary.iterrows()]


def _refuse_two_runs(frame: pd.DataFrame) -> None:
    """:class:`AblationError` at the first row whose run is not its step's first run."""
    first = frame.groupby("Step").Run.transform("first")
    other = frame[[run != want for run, want in zip(frame.Run, first)]]
    if len(other):
        row = other.iloc[0]
        raise AblationError(f"two different runs for step '{STEPS[row.Step].label}': "
                            f"{first[row.name]} and {row.Run}; keep one per results file")


def _step_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per step present (ascending): ``Run``, ``Ranks``, the ok repeats' ``Median``,
    ``Lo``, ``Hi`` and count (``Repeats``), the ``Failed`` statuses, ``VsVanilla`` (the median
    over step 0's) and ``WithinNoise`` (the range overlaps the previous step's)."""
    ok = frame.Status.eq("ok")
    out = frame.groupby("Step").agg(Run=("Run", "first"), Ranks=("nGPU", "first"))
    out = out.join(frame[ok].groupby("Step").Thrpt.agg(
        Median="median", Lo="min", Hi="max", Repeats="count"))
    out["Repeats"] = out.Repeats.fillna(0)
    out["Failed"] = frame[~ok].groupby("Step").Status.agg(list)
    out["Failed"] = [f if isinstance(f, list) else [] for f in out.Failed]
    vanilla = out.Median.get(0)
    out["VsVanilla"] = out.Median / vanilla if vanilla else math.nan  # also NaN: no vanilla
    out["WithinNoise"] = (out.Lo <= out.Hi.shift()) & (out.Lo.shift() <= out.Hi)
    return out


def _number(value: float) -> Optional[float]:
    return None if pd.isna(value) else float(value)


def format_table(results: Sequence[StepResult]) -> str:
    """A Markdown table: per step its run, samples/s (median, min-max, repeats), per rank, and
    the speedup of the medians over vanilla HF."""
    lines = ["| Step | Run | samples/s, median (min-max) | per rank | vs vanilla |",
             "|---|---|---:|---:|---:|"]
    for r in results:
        mode, _, seq, _, n, batch, ckpt, _, knobs = r.run
        run = f"`{mode}` n={n} bs={batch} seq={seq}" + (f" ckpt={ckpt}" if ckpt != "0" else "")
        run += f" `{knobs}`" if knobs else ""
        if r.median is None:
            lines.append(f"| {r.step.label} | {run} | {', '.join(r.failed)} | - | - |")
            continue
        ratio = f"{r.vs_vanilla:.2f}x" if r.vs_vanilla is not None else "-"
        lines.append(f"| {r.step.label} | {run} | {r.median:.3g} ({r.lo:.3g}-{r.hi:.3g}, "
                     f"{r.repeats}x) | {r.per_rank(r.median):.3g} | {ratio} |")
    return "\n".join(lines)


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
