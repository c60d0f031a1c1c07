"""Figure 10 from a study database only: ``python -m autotune.plot STUDY.db -o FIG``.

Left panel: throughput over batch size x checkpoint ratio, a filled contour of the ``ok``
candidates of the ground-truth study (``grid``; else of every study's candidates), the ``oom``
candidates shaded (hatched cells, an ``x`` each), the candidates each strategy explored marked
(one marker per study) and the best one starred. Right panel: the best throughput found vs. the
number of evaluations, one line per study. Writes ``FIG.png`` and ``FIG.pdf`` and prints, per
study, its best candidate and after how many evaluations it came within 5 % of the ground
truth's best. Plot code holds no numbers: everything comes from the database.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["load_studies", "summarise", "plot", "main"]

MARKERS = {"grid": ("s", "none"), "search": ("*", "tab:red"), "tpe": ("o", "tab:blue")}


def load_studies(db: str, studies: Sequence[str] = ()) -> Dict[str, list]:
    """The evaluated records of each study in ``db`` (all studies when none are named)."""
    import optuna

    from slapo.autotune import load_records

    names = list(studies) or [s.study_name for s in optuna.get_all_study_summaries(
        optuna.storages.RDBStorage(f"sqlite:///{db}"))]
    return {name: [r for r in load_records(db, name) if r.evaluated] for name in names}


def _best_curve(records: list) -> List[Optional[float]]:
    best, curve = None, []
    for r in records:
        if r.status == "ok" and (best is None or r.throughput > best):
            best = r.throughput
        curve.append(best)
    return curve


def summarise(studies: Dict[str, list], x: str = "batch_size",
              y: str = "ckpt_ratio") -> Dict[str, dict]:
    """Per study: evaluations, best (params, throughput), evaluations to reach 95 % of the
    ground truth's best (the grid's, else the best of all studies)."""
    truth_name = "grid" if "grid" in studies else None
    pool = studies[truth_name] if truth_name else [r for rs in studies.values() for r in rs]
    ok = [r.throughput for r in pool if r.status == "ok"]
    target = max(ok) if ok else None
    out = {}
    for name, records in studies.items():
        curve = _best_curve(records)
        best = max((r for r in records if r.status == "ok"), key=lambda r: r.throughput,
                   default=None)
        reach = next((i + 1 for i, b in enumerate(curve)
                      if target is not None and b is not None and b >= 0.95 * target), None)
        out[name] = dict(evaluations=len(records), best=best and {
            x: best.params.get(x), y: best.params.get(y), "throughput": best.throughput},
            within_5pct_after=reach, oom=sum(r.status == "oom" for r in records))
    return out


def _grid(records: list, x: str, y: str):
    import numpy as np

    xs = sorted({r.params[x] for r in records})
    ys = sorted({r.params[y] for r in records})
    z = np.full((len(ys), len(xs)), np.nan)
    oom = np.zeros_like(z)
    for r in records:
        i, j = ys.index(r.params[y]), xs.index(r.params[x])
        if r.status == "ok":
            z[i, j] = r.throughput
        elif r.status == "oom":
            oom[i, j] = 1
    return xs, ys, z, oom


def plot(studies: Dict[str, list], out: str, x: str = "batch_size", y: str = "ckpt_ratio",
         title: str = "") -> Tuple[str, str]:
    """Draw the figure (see the module docstring); returns the png and pdf paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    pool = studies.get("grid") or [r for rs in studies.values() for r in rs]
    every = [r for rs in studies.values() for r in rs]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs, ys, z, _ = _grid(pool, x, y)
    _, _, _, oom = _grid([r for r in every if r.params[x] in xs and r.params[y] in ys], x, y)
    if np.isfinite(z).sum() >= 4 and len(xs) > 1 and len(ys) > 1:
        filled = ax.contourf(xs, ys, np.ma.masked_invalid(z), levels=12, cmap="viridis")
        fig.colorbar(filled, ax=ax, label="throughput (samples/s)")
    if oom.any():
        ax.contourf(xs, ys, oom, levels=[0.5, 1.5], colors="none", hatches=["///"])
        pts = [(r.params[x], r.params[y]) for r in every if r.status == "oom"]
        ax.scatter(*zip(*pts), marker="x", color="black", s=25, label="OOM")
    for name, records in studies.items():
        marker, color = MARKERS.get(name, ("^", "tab:orange"))
        pts = [(r.params[x], r.params[y]) for r in records]
        if pts:
            ax.scatter(*zip(*pts), marker=marker, facecolors=color, edgecolors="white"
                       if color != "none" else "grey", s=70 if marker == "*" else 30,
                       label=f"{name} ({len(pts)} evaluated)", zorder=3)
    ok = [r for r in every if r.status == "ok"]
    if ok:
        best = max(ok, key=lambda r: r.throughput)
        ax.scatter([best.params[x]], [best.params[y]], marker="P", s=160, color="gold",
                   edgecolors="black", zorder=4, label=f"best {best.throughput:.3g}")
    ax.set(xlabel=x, ylabel=y, title=title or "throughput over the search space")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    for name, records in studies.items():
        curve = _best_curve(records)
        ax2.step(range(1, len(curve) + 1), [np.nan if b is None else b for b in curve],
                 where="post", label=name, color=MARKERS.get(name, (0, "tab:orange"))[1]
                 if name != "grid" else "grey")
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
    args = p.parse_args(argv)
    studies = load_studies(args.db, args.studies)
    for name, s in summarise(studies).items():
        print(f"{name}: {s['evaluations']} evaluated ({s['oom']} oom), best {s['best']}, "
              f"within 5% of the ground truth's best after {s['within_5pct_after']}")
    for path in plot(studies, args.out, title=args.title):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
