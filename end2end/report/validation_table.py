"""The report blocks of the validation set of published GPU measurements (issue 35, item 4),
from committed files only (no clock, no machine):

* ``validation FILE``: a run of ``python -m end2end.simulate.validate --out FILE``: where it
  comes from (command, date, machine, commit), published vs predicted per row (samples/s, TFLOP/s
  per GPU, memory, fits) with the errors, and the summary of each part against the goals;
* ``validation-sources [SOURCES]``: the set's source table (``sources.tsv``, default
  ``docs/results/validation/sources.tsv``): where every published number is and what the project
  cannot express.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

from .blocks import ReportError
from .registry import generator

__all__ = ["validation_block", "sources_block"]


def _file(root: Path, args: Sequence[str], kind: str, default: str = "") -> Path:
    files = [a for a in args if not a.startswith("--")] or ([default] if default else [])
    if len(files) != 1:
        raise ReportError(f"'{kind}' needs exactly one file, got {list(args)}",
                          hint=f"e.g. <!-- report: {kind} docs/results/validation/"
                               "validation.tsv -->")
    path = root / files[0]
    if not path.is_file():
        raise ReportError(f"{files[0]} does not exist", hint="commit it, or fix the path")
    return path


def _num(value, pct: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.0f}%" if pct else f"{value:.4g}"


def _fits(value) -> str:
    return {True: "yes", False: "**no**", None: "?"}[value]


@generator("validation")
def validation_block(root: Path, args: Sequence[str]) -> str:
    """Markdown of a committed ``end2end.simulate.validate`` run."""
    from end2end.simulate.validate import PARTS, read_results, summary_text

    path = _file(root, args, "validation")
    header, rows = read_results(path)
    if not rows:
        raise ReportError(f"{path.name} has no rows", hint="re-run its command")
    rel = path.relative_to(root)
    lines = [f"Predicted {header.get('date', 'undated')} on {header.get('machine', '?')}, "
             f"commit {header.get('commit', '?')}, by `{header.get('command', '?')}`; {len(rows)} "
             f"rows in [`{rel}`](/{rel}). These are predictions of the simulator, beside "
             "published measurements; no GPU ran them here.", ""]
    for part in PARTS:
        sel = [r for r in rows if r["part"] == part]
        if not sel:
            continue
        lines += [f"**{part}**", "",
                  "| point | device | run | samples/s published | predicted | error | "
                  "TFLOP/s/GPU published | predicted | memory GiB published | predicted | "
                  "error | fits published / predicted |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in sel:
            status = "" if r["status"] in ("sim", "sim-oom") else f" ({r['status']})"
            lines.append(
                f"| `{r['id']}` | {r['device']} | `{r['run']}` | {_num(r['pub_samples_s'])} | "
                f"{_num(r['pred_samples_s'])} | {_num(r['thr_err'], True)} | "
                f"{_num(r['pub_tflops_gpu'])} | {_num(r['pred_tflops_gpu'])} | "
                f"{_num(r['pub_mem_gib'])} | {_num(r['pred_mem_gib'])} | "
                f"{_num(r['mem_err'], True)} | {_fits(r['pub_fits'])} / "
                f"{_fits(r['pred_fits'])}{status} |")
        lines += ["", summary_text(rows, part), ""]
    lines.append("TFLOP/s per GPU in the project's convention (3 x forward, no recomputation) "
                 "on both sides; memory: the predicted peak of live tensors plus the profile's "
                 "allocator overhead; a published OOM has no throughput.")
    return "\n".join(lines)


@generator("validation-sources")
def sources_block(root: Path, args: Sequence[str]) -> str:
    """Markdown of the set's source table."""
    path = _file(root, args, "validation-sources", "docs/results/validation/sources.tsv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        raise ReportError(f"{path.name} has no rows", hint="add the published points")
    out = ["| point | part | published | source, location (version) | hardware | system | "
           "precision | recompute | cannot express |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        value = "OOM" if r["metric"] == "oom" else f"{r['value']} {r['metric']}"
        if r["memory_gib"]:
            value += f", {r['memory_gib']} GiB"
        cells = [f"`{r['id']}`", r["part"], value,
                 f"{r['source']}: {r['location']} ({r['version']})", r["hardware"], r["system"],
                 r["precision"], r["recompute"], r["cannot_express"] or "-"]
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(out)
