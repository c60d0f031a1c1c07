"""Figure 10 from a study database only: ``python -m autotune.plot STUDY.db -o FIG``.

Left panel: throughput over batch size x checkpoint ratio, a filled contour of the ``ok``
candidates of the ground-truth study (``grid``; else of every study's candidates), the ``oom``
candidates shaded (hatched cells, an ``x`` each), the candidates each strategy explored marked
(one marker per study) and the best one starred. Right panel: the best throughput found vs. the
number of evaluations, one line per study. Writes ``FIG.png`` and ``FIG.pdf`` and prints, per
study, its best candidate and after how many evaluations it came within 5 % of the ground
truth's best. Plot code holds no numbers: everything comes from the database, whose records
become one pandas DataFrame (:func:`records_frame`) that the summary and the panels aggregate.
A database that is missing, not SQLite, or without the named study is one error line (exit
status 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from end2end.cli import configure_logging, get_logger, report_errors
from slapo.errors import TuneError

__all__ = ["load_studies", "records_frame", "summarise", "plot", "main"]

log = get_logger("autotune.plot")
MARKERS = {"grid": ("s", "none"), "search": ("*", "tab:red"), "tpe": ("o", "tab:blue")}


def load_studies(db: str, studies: Sequence[str] = ()) -> Dict[str, list]:
    """The evaluated records of each study in ``db`` (all studies when none are named)."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    from slapo.autotune import load_records

    if "://" not in db and not Path(db).is_file():  # SQLite would create an empty one
        raise TuneError(f"{db}: no such study database",
                        hint="give the .db file autotune/run.sh wrote (results/autotune-*.db)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        names = list(studies) or [s.study_name for s in optuna.get_all_study_summaries(
            optuna.storages.RDBStorage(db if "://" in db else f"sqlite:///{db}"))]
    except SQLAlchemyError as exc:
        reason = " ".join(str(getattr(exc, "orig", None) or exc).split())
        raise TuneError(f"{db}: cannot open it as a study database ({reason})",
                        hint="give the .db file autotune/run.sh wrote") from None
    return {name: [r for r in load_records(db, name) if r.evaluated] for name in names}


def records_frame(studies: Dict[str, list], x: str = "batch_size",
                  y: str = "ckpt_ratio") -> pd.DataFrame:
    """The records of every study as one DataFrame, a row each in order: ``Study``, ``Eval``
    (1, 2, ... within the study), ``Status``, ``Throughput`` (NaN: none), the parameters ``x``
    and ``y``, ``Best`` (the best ok throughput of the study so far, NaN before its first ok
    one) and the ``Record`` itself."""
    frame = pd.DataFrame(
        [(name, i, r.status, r.throughput, r.params.get(x), r.params.get(y), r)
         for name, records in studies.items() for i, r in enumerate(records, start=1)],
        columns=["Study", "Eval", "Status", "Throughput", x, y, "Record"])
    frame = frame.astype({"Study": "str", "Eval": "int64", "Status": "str",
                          "Throughput": "float64"})
    ok = frame.Throughput.where(frame.Status.eq("ok"))
    frame["Best"] = ok.groupby(frame.Study).cummax().groupby(frame.Study).ffill()
    return frame


def summarise(studies: Dict[str, list], x: str = "batch_size",
              y: str = "ckpt_ratio") -> Dict[str, dict]:
    """Per study: evaluations, best (params, throughput), evaluations to reach 95 % of the
    ground truth's best (the grid's, else the best of all studies)."""
    frame = records_frame(studies, x, y)
    truth = frame[frame.Study.eq("grid")] if "grid" in studies else frame
    target = truth.Throughput[truth.Status.eq("ok")].max()  # NaN: nothing ok
    reach = frame[frame.Best >= 0.95 * target].groupby("Study").Eval.min()
    ok = frame[frame.Status.eq("ok")]
    best = ok.loc[ok.groupby("Study").Throughput.idxmax()].set_index("Study").Record
    counts = frame.groupby("Study").agg(evaluations=("Eval", "size"),
                                        oom=("Status", lambda s: int(s.eq("oom").sum())))
    out = {}
    for name in studies:
        record = best.get(name)
        out[name] = dict(
            evaluations=int(counts.evaluations.get(name, 0)), best=record and {
                x: record.params.get(x), y: record.params.get(y),
                "throughput": record.throughput},
            within_5pct_after=int(reach[name]) if name in reach else None,
            oom=int(counts.oom.get(name, 0)))
    return out


def _grid(frame: pd.DataFrame, value: pd.Series, x: str, y: str, xs: list, ys: list):
    """``value`` over the (``y``, ``x``) cells ``ys`` x ``xs`` (rows, columns), the last one
    of a cell measured twice; NaN where there is none."""
    cells = frame.assign(Value=value).dropna(subset=["Value"])
    if cells.empty:
        return np.full((len(ys), len(xs)), np.nan)
    table = cells.pivot_table(index=y, columns=x, values="Value", aggfunc="last")
    return table.reindex(index=ys, columns=xs).to_numpy(dtype=float)


def plot(studies: Dict[str, list], out: str, x: str = "batch_size", y: str = "ckpt_ratio",
         title: str = "") -> Tuple[str, str]:
    """Draw the figure (see the module docstring); returns the png and pdf paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = records_frame(studies, x, y)
    pool = every[every.Study.eq("grid")] if every.Study.eq("grid").any() else every
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs, ys = sorted(pool[x].unique()), sorted(pool[y].unique())
    z = _grid(pool, pool.Throughput.where(pool.Status.eq("ok")), x, y, xs, ys)
    is_oom = every.Status.eq("oom")
    oom = np.nan_to_num(_grid(every, is_oom.astype(float).where(is_oom), x, y, xs, ys))
    if np.isfinite(z).sum() >= 4 and len(xs) > 1 and len(ys) > 1:
        filled = ax.contourf(xs, ys, np.ma.masked_invalid(z), levels=12, cmap="viridis")
        fig.colorbar(filled, ax=ax, label="throughput (samples/s)")
    if oom.any():
        ax.contourf(xs, ys, oom, levels=[0.5, 1.5], colors="none", hatches=["///"])
        pts = every[every.Status.eq("oom")]
        ax.scatter(pts[x], pts[y], marker="x", color="black", s=25, label="OOM")
    for name in studies:
        marker, color = MARKERS.get(name, ("^", "tab:orange"))
        pts = every[every.Study.eq(name)]
        if len(pts):
            ax.scatter(pts[x], pts[y], marker=marker, facecolors=color, edgecolors="white"
                       if color != "none" else "grey", s=70 if marker == "*" else 30,
                       label=f"{name} ({len(pts)} evaluated)", zorder=3)
    ok = every[every.Status.eq("ok")]
    if len(ok):
        best = ok.loc[ok.Throughput.idxmax()]
        ax.scatter([best[x]], [best[y]], marker="P", s=160, color="gold",
                   edgecolors="black", zorder=4, label=f"best {best.Throughput:.3g}")
    ax.set(xlabel=x, ylabel=y, title=title or "throughput over the search space")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    for name in studies:
        curve = every.Best[every.Study.eq(name)]
        ax2.step(range(1, len(curve) + 1), curve, where="post", label=name,
                 color=MARKERS.get(name, (0, "tab:orange"))[1] if name != "grid" else "grey")
    ax2.set(xlabel="evaluations", ylabel="best throughput found (samples/s)",
            title="best so far vs. evaluations")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    paths = (f"{out}.png", f"{out}.pdf")
    for p in paths:
        fig.savefig(p, dpi=150)
    plt.close(fig)
    return paths


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autotune.plot", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("db", help="study database (SQLite)")
    p.add_argument("-o", "--out", required=True, help="output path without extension")
    p.add_argument("--studies", nargs="*", default=(), help="studies to draw (default: all)")
    p.add_argument("--title", default="")
    p.add_argument("--debug", action="store_true", help="full traceback of an error")
    args = p.parse_args(argv)
    configure_logging()

    def run() -> int:
        studies = load_studies(args.db, args.studies)
        for name, s in summarise(studies).items():  # the summary: the command's output
            print(f"{name}: {s['evaluations']} evaluated ({s['oom']} oom), best {s['best']}, "
                  f"within 5% of the ground truth's best after {s['within_5pct_after']}")
        for path in plot(studies, args.out, title=args.title):
            log.info("wrote %s", path)
        return 0

    return report_errors("autotune.plot", run, args.debug)


if __name__ == "__main__":
    sys.exit(main())
