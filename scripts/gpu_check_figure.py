#!/usr/bin/env python
"""The figure of scripts/gpu_check.sh: attention kernels and eager-vs-Slapo training, one GPU.

    python scripts/gpu_check_figure.py DIR      # reads DIR/attention.tsv, DIR/gpu_check.tsv

Left panel: fwd+bwd speedup of each attention kernel over eager attention, per case. Right
panel: training throughput (samples/s) of eager HF vs Slapo per model, with the ratio on top.
Writes ``DIR/gpu_check.png`` and ``.pdf`` with matplotlib, or ``DIR/gpu_check.svg`` (plain
text, no dependency) when matplotlib is not installed. Also prints both tables.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Tuple

if TYPE_CHECKING:
    import pandas as pd

Bars = Dict[str, Dict[str, float]]  # group -> label -> value


def _nested(values: "pd.Series") -> Bars:
    """A Series indexed by (group, label) as ``{group: {label: value}}``, in its order."""
    bars: Bars = {}
    for (group, label), value in values.items():
        bars.setdefault(group, {})[label] = float(value)
    return bars


def attention_bars(path: Path) -> Bars:
    """Per case, each kernel's fwd+bwd speedup over eager (``attention.tsv``, ok rows)."""
    if not path.exists():
        return {}
    import pandas as pd

    rows = pd.read_csv(path, sep="\t", dtype={"case": str, "backend": str, "status": str},
                       na_values=["na"])
    rows = rows[rows.status.eq("ok") & rows.backend.ne("eager")]
    return _nested(rows.groupby(["case", "backend"], sort=False).speedup_vs_eager.last())


def training_bars(path: Path) -> Bars:
    """Per model, each mode's best throughput (samples/s; 0 for a run without one)."""
    if not path.exists():
        return {}
    from end2end.results.stats import results_frame

    rows = results_frame(path, check_twin=False)
    value = rows.Thrpt.where(rows.Status.eq("ok")).fillna(0.0)
    label = rows.Model.str.split("/").str[-1]
    return _nested(value.groupby([label, rows.Impl], sort=False).max())


def _print(title: str, bars: Bars) -> None:
    print(title)
    for group, values in bars.items():
        print(f"  {group:24s} " + "  ".join(f"{k}={v:.3g}" for k, v in values.items()))


def _matplotlib(panels: List[Tuple[str, str, Bars]], out: Path) -> List[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 3.6))
    axes = axes if len(panels) > 1 else [axes]
    for ax, (title, ylabel, bars) in zip(axes, panels):
        labels = sorted({k for v in bars.values() for k in v})
        width = 0.8 / max(1, len(labels))
        for i, label in enumerate(labels):
            xs = [g + (i - (len(labels) - 1) / 2) * width for g in range(len(bars))]
            ys = [values.get(label, 0.0) for values in bars.values()]
            rects = ax.bar(xs, ys, width, label=label)
            ax.bar_label(rects, fmt="%.3g", fontsize=7)
        ax.set_xticks(range(len(bars)), list(bars), fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        if "speedup" in ylabel:
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths = [out.with_suffix(".png"), out.with_suffix(".pdf")]
    for p in paths:
        fig.savefig(p, dpi=120)
    return paths


def _svg(panels: List[Tuple[str, str, Bars]], out: Path) -> List[Path]:
    """A minimal grouped bar chart as SVG text (fallback without matplotlib)."""
    colours = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
    w, h, parts = 420, 260, []
    for p, (title, ylabel, bars) in enumerate(panels):
        x0 = p * w
        labels = sorted({k for v in bars.values() for k in v})
        top = max([v for vals in bars.values() for v in vals.values()] + [1e-9])
        parts.append(f'<text x="{x0 + 10}" y="16" font-size="12">{title} ({ylabel})</text>')
        gw = (w - 40) / max(1, len(bars))
        for g, (group, values) in enumerate(bars.items()):
            bw = gw * 0.8 / max(1, len(labels))
            for i, label in enumerate(labels):
                v = values.get(label, 0.0)
                bh = 190 * v / top
                x = x0 + 30 + g * gw + i * bw
                parts.append(f'<rect x="{x:.1f}" y="{220 - bh:.1f}" width="{bw:.1f}" '
                             f'height="{bh:.1f}" fill="{colours[i % 6]}"/>'
                             f'<text x="{x:.1f}" y="{216 - bh:.1f}" font-size="8">{v:.2g}</text>')
            parts.append(f'<text x="{x0 + 30 + g * gw:.1f}" y="236" font-size="9">{group}</text>')
        for i, label in enumerate(labels):
            parts.append(f'<text x="{x0 + 30 + i * 80}" y="252" font-size="9" '
                         f'fill="{colours[i % 6]}">{label}</text>')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w * len(panels)}" height="{h}">'
           + "".join(parts) + "</svg>\n")
    path = out.with_suffix(".svg")
    path.write_text(svg)
    return [path]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    out_dir = Path(argv[0])
    panels = [("attention kernels vs eager, bf16 fwd+bwd", "speedup",
               attention_bars(out_dir / "attention.tsv")),
              ("training, 1 GPU, bf16", "samples/s", training_bars(out_dir / "gpu_check.tsv"))]
    panels = [p for p in panels if p[2]]
    if not panels:
        print(f"gpu_check_figure.py: nothing to plot in {out_dir}", file=sys.stderr)
        return 1
    for title, _, bars in panels:
        _print(title, bars)
    try:
        paths = _matplotlib(panels, out_dir / "gpu_check")
    except ImportError:
        paths = _svg(panels, out_dir / "gpu_check")
    print("figure: " + ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
