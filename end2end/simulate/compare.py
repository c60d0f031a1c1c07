"""``python -m end2end.simulate.compare MEASURED SIMULATED``: each measured run beside the
simulator's prediction of it (issue 25, item 8: ``scripts/gpu_check.sh`` prints this after its
sweep, the ``h200`` prediction beside the H200 measurement).

One line per run found in either file (a config line's run: mode, model, ranks, shape, batch,
checkpointing, layout, knobs; repeats are one run): the predicted samples/s and peak memory per
rank (the simulated row's ``Thrpt`` and ``PerGPUMem``, marked predicted, with the profile), the
measured ones (median over the ``ok`` repeats), and the ratio measured / predicted of each. A run
that did not measure ``ok`` or was not predicted ``sim``/``sim-oom`` is still a line: its status
and the start of its error instead of the numbers, never a silent gap. Simulated and measured
rows stay in files of their own (``end2end.simulate`` refuses to mix them); this only prints
them side by side and computes no speedup across the two.

Peak memory compares like with like on GPUs: the driver measures ``torch.cuda.max_memory_allocated``
(live tensors) and a GPU profile predicts the peak of live tensors (docs/simulate.md; the
profile's allocator overhead and reserved memory only decide ``sim-oom``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["Comparison", "side_by_side", "format_table", "text_table", "main"]

Comparison = Dict[str, object]


def _run(row) -> Tuple:
    """A row's run, repeats together (its key without the repeat index)."""
    return row.key[:-1]


def _label(row) -> str:
    layout = f" tp={row.tp} pp={row.pp}" if (row.pp or 1) > 1 else ""
    knobs = f" [{row.knobs}]" if row.knobs else ""
    dec = f"/{row.dec_seq}" if row.dec_seq else ""
    return (f"{row.impl} {row.model} n={row.ngpu} s={row.seq}{dec} b={row.batch} "
            f"ckpt={row.ckpt}{layout}{knobs}")


def _side(rows, good: Sequence[str]) -> Dict[Tuple, Dict[str, object]]:
    """Per run: the median samples/s and memory of its rows with a ``good`` status, else the
    last row's status and error; and its label, device and first appearance."""
    out: Dict[Tuple, Dict[str, object]] = {}
    for i, row in enumerate(rows):
        entry = out.setdefault(_run(row), dict(label=_label(row), order=i, device=row.device,
                                                thrpt=[], mem=[], status=row.status,
                                                error=row.error))
        if row.status in good and row.thrpt is not None:
            entry["thrpt"].append(row.thrpt)
            if row.per_gpu_mem is not None:
                entry["mem"].append(row.per_gpu_mem)
            entry["status"], entry["error"] = row.status, ""
        elif not entry["thrpt"]:
            entry["status"], entry["error"] = row.status, row.error
    for entry in out.values():
        for what in ("thrpt", "mem"):
            entry[what] = statistics.median(entry[what]) if entry[what] else None
    return out


def _ratio(measured: Optional[float], predicted: Optional[float]) -> Optional[float]:
    return measured / predicted if measured and predicted else None


def side_by_side(measured: Path, simulated: Path) -> List[Comparison]:
    """One :data:`Comparison` per run of either file, in the order the runs first appear (the
    measured file's first): ``label``, ``measured`` and ``predicted`` (each ``thrpt``, ``mem``,
    ``status``, ``error``, ``device``, or None when the file has no row of the run),
    ``thrpt_ratio`` and ``mem_ratio`` (measured / predicted, None unless both are numbers)."""
    from end2end.results.store import SIMULATED_STATUSES, read_results

    meas = _side(read_results(measured).rows, ("ok",))
    pred = _side(read_results(simulated).rows, SIMULATED_STATUSES)
    runs = sorted(set(meas) | set(pred),
                  key=lambda k: (k not in meas, (meas.get(k) or pred[k])["order"]))
    out: List[Comparison] = []
    for run in runs:
        m, p = meas.get(run), pred.get(run)
        out.append(dict(label=(m or p)["label"], measured=m, predicted=p,
                        thrpt_ratio=_ratio(m and m["thrpt"], p and p["thrpt"]),
                        mem_ratio=_ratio(m and m["mem"], p and p["mem"])))
    return out


def _cell(side: Optional[Dict[str, object]], what: str, unit: str) -> str:
    if side is None:
        return "no row"
    if side[what] is not None:
        return f"{side[what]:.3g}{unit}"
    if what == "mem" and side["thrpt"] is not None:
        return "na"
    return f"{side['status']}: {str(side['error'])[:40]}".rstrip(": ")


def format_table(rows: List[Comparison], profile: str = "") -> str:
    """The comparison as a text table; ``profile`` names the prediction's device profile."""
    def devices(side: str) -> str:
        found = sorted({str(r[side]["device"]) for r in rows if r[side] and r[side]["device"]})
        return ", ".join(found) or "none"

    name = f" ({profile})" if profile else ""
    head = ["run", "samples/s measured", f"predicted{name}", "meas/pred", "GB/rank measured",
            f"predicted{name}", "meas/pred"]
    body = []
    for r in rows:
        m, p = r["measured"], r["predicted"]
        mark = " (predicted, OOM)" if p and p["status"] == "sim-oom" else " (predicted)"
        body.append([str(r["label"]), _cell(m, "thrpt", ""), _cell(p, "thrpt", mark),
                     f"{r['thrpt_ratio']:.2f}" if r["thrpt_ratio"] else "-",
                     _cell(m, "mem", ""), _cell(p, "mem", mark),
                     f"{r['mem_ratio']:.2f}" if r["mem_ratio"] else "-"])
    return text_table(f"measured on {devices('measured')}; predicted for "
                      f"{devices('predicted')}: the simulator's predictions, not measurements",
                      head, body)


def text_table(title: str, head: List[str], body: List[List[str]]) -> str:
    """``title``, then ``head`` and ``body`` as left-aligned columns under a dashed rule."""
    widths = [max(len(line[i]) for line in [head] + body) for i in range(len(head))]
    text = [title]
    for line in [head, ["-" * w for w in widths]] + body:
        text.append("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
    return "\n".join(text) + "\n"


def build_parser() -> argparse.ArgumentParser:
    from end2end.cli import HelpFormatter

    p = argparse.ArgumentParser(prog="python -m end2end.simulate.compare",
                                formatter_class=HelpFormatter, description=__doc__)
    p.add_argument("measured", help="results TSV of measured runs (e.g. gpu_check.tsv)")
    p.add_argument("simulated", help="results TSV of simulated runs of the same config "
                   "(python -m end2end.simulate CONFIG --device PROFILE --results FILE)")
    p.add_argument("--profile", default="", help="the prediction's profile, for the header")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print the table; 1 with the reason when a file is missing or holds no rows."""
    args = build_parser().parse_args(argv)
    for path in (args.measured, args.simulated):
        if not Path(path).is_file():
            print(f"end2end.simulate.compare: {path} does not exist", file=sys.stderr)
            return 1
    rows = side_by_side(Path(args.measured), Path(args.simulated))
    if not rows:
        print("end2end.simulate.compare: no rows in either file", file=sys.stderr)
        return 1
    sys.stdout.write(format_table(rows, args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
