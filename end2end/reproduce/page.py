"""The one page a reproduction ends with: ``DIR/index.md`` and its HTML twin ``DIR/index.html``
(figures inline). Per step: how it ended, the figure it drew beside the committed one, its
tables beside the committed tables, and the paper's value; on top, the paper's headline numbers
beside this run's (the ``paper`` block of :mod:`end2end.report` over this run's files).

Every table is a report block (:func:`end2end.report.generators.render`) over a results file, so
this page holds no number of its own; a block whose file is missing (a failed step) says so.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from end2end.report.blocks import Block, ReportError
from end2end.report.generators import render
from end2end.report.paper import PAPER, paper_value
from end2end.reproduce.plan import Step
from end2end.reproduce.runner import ROOT, Outcome
from end2end.sweep.progress import format_duration

__all__ = ["write_index", "machine_line"]

LINK = re.compile(r"\]\(/([^)\s]+)\)")
PLAN_NOTE = {
    "quick": "**--quick**: the tiny models through every CPU flow, one panel of each "
             "paper-scale prediction. It shows that every figure and table is made end to end; "
             "its numbers are not the study's (compare the committed ones for those).",
    "full": "**--full**: the committed studies' own commands; where this machine was busy "
            "while a round was measured, the tables mark it with `!`.",
}


def machine_line() -> str:
    """``Intel(R) Xeon(R) Processor, 2 cores, load 1.9; commit abc1234(-dirty)``."""
    model = "unknown CPU"
    try:
        model = next(line.split(":", 1)[1].strip() for line in
                     Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
        load = Path("/proc/loadavg").read_text().split()[0]
    except (OSError, StopIteration):
        load = "?"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                                capture_output=True, timeout=30).stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, text=True, capture_output=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "unknown", ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{model}, {cores} cores, 1-minute load {load} at the end; commit {commit}"
            f"{'-dirty' if dirty.strip() else ''}")


def _block(root: Path, out: Path, args: Tuple[str, ...]) -> str:
    """A report block rendered over files under ``root``; its root-relative links made
    relative to ``out`` (where the page is); a missing or unreadable source is one line."""
    block = Block(Path("index.md"), 0, args[0], tuple(args[1:]), "", (0, 0))
    try:
        text = render(root, block)
    except ReportError as exc:
        return f"*Not available: {exc.what}*"
    return LINK.sub(lambda m: f"]({os.path.relpath(root / m.group(1), out)})", text)


def _paper_value(key: str) -> str:
    if key in PAPER:
        return f"{paper_value(key)} ({PAPER[key][1]})"
    return key


def _figure_table(step: Step, out: Path) -> List[str]:
    """This run's figures beside the committed ones (copied to ``DIR/committed/``)."""
    rows = []
    for figure in step.figures:
        mine = out / step.name / figure.path
        left = (f"![{figure.path}]({step.name}/{figure.path})" if mine.is_file()
                else f"*no figure: {step.name}/{figure.path} was not drawn*")
        right = "*nothing committed*"
        if figure.committed and (ROOT / figure.committed).is_file():
            copy = out / "committed" / Path(figure.committed).name
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / figure.committed, copy)
            right = f"![{figure.committed}](committed/{copy.name})"
        rows.append(f"| {left} | {right} |")
    if not rows:
        return []
    return ["| this run | committed |", "|---|---|", *rows, ""]


def _step_section(step: Step, outcome: Optional[Outcome], out: Path) -> List[str]:
    if outcome is None:
        status = "not run"
    elif outcome.status == "ok":
        status = f"ok in {format_duration(outcome.seconds)} ({outcome.finished})"
    else:
        status = f"**failed** after {format_duration(outcome.seconds)}: {outcome.error}"
    lines = [f"## {step.title}", "", f"What: {step.what}. Status: {status}.", ""]
    if outcome is not None and outcome.commands:
        lines += ["Commands: " + ", then ".join(f"`{c}`" for c in outcome.commands) + ".", ""]
    if step.paper:
        lines += [f"The paper: {_paper_value(step.paper)}.", ""]
    lines += _figure_table(step, out)
    for args in step.blocks:
        lines += [f"**This run** (`{args[0]}` of `{step.name}/{args[1]}`):", "",
                  _block(out / step.name, out, args), ""]
    for args in step.committed:
        lines += [f"**Committed** (`{args[0]}` of `{args[1]}`):", "",
                  _block(ROOT, out, args), ""]
    return lines


def _paper_args(steps: Sequence[Step], out: Path) -> Optional[Tuple[str, ...]]:
    """The ``paper`` block over this run's files that exist (None without a Figure 7 file)."""
    files = {"--cpu": ("fig7", ".tsv"), "--v100": ("sim-fig7", ".sim.tsv"),
             "--fig8": ("sim-fig8", ".sim.tsv"), "--grid": ("autotune", ".db"),
             "--tune-v100": ("sim-fig10", ".predictions.jsonl"), "--ablation": ("ablation", ".tsv"),
             "--ablation-v100": ("sim-fig9", ".sim.tsv")}
    by_name = {s.name: s for s in steps}
    args: List[str] = ["paper"]
    for flag, (name, suffix) in files.items():
        step = by_name.get(name)
        found = [a[1] for a in (step.blocks if step else ()) if a[1].endswith(suffix)]
        if found and (out / name / found[0]).is_file():
            args += [flag, f"{name}/{found[0]}"]
    return tuple(args) if "--cpu" in args else None


def _paper_block(out: Path, args: Tuple[str, ...]) -> str:
    """The ``paper`` block over this run's files, leaving out a file it cannot read (a step
    that failed half-way) rather than the whole table; what was left out is said below it."""
    kept, dropped = list(args[:3]), []
    for flag, path in zip(args[3::2], args[4::2]):
        trial = _block(out, out, tuple(kept + [flag, path]))
        if trial.startswith("*Not available"):
            dropped.append(f"`{path}` ({trial})")
        else:
            kept.extend([flag, path])
    text = _block(out, out, tuple(kept))
    return text + ("\n\nLeft out: " + "; ".join(dropped) if dropped else "")


def write_index(out: Path, steps: Sequence[Step], outcomes: Dict[str, Outcome], plan_name: str,
                command: str, seconds: float) -> Tuple[Path, Path]:
    """Write ``out/index.md`` and ``out/index.html``; returns their paths."""
    ok = sum(1 for s in steps if outcomes.get(s.name) and outcomes[s.name].status == "ok")
    lines = [f"# Slapo artifact: the paper's figures and tables reproduced (--{plan_name})", "",
             f"Made by `{command}` on {machine_line()}; finished "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, this run took "
             f"{format_duration(seconds)}; {ok} of {len(steps)} steps ok. Every table below is "
             "generated from the results files of this folder (this run) or of `docs/results/` "
             "(committed); the paper's values are quoted with their source.", "",
             PLAN_NOTE[plan_name], ""]
    paper = _paper_args(steps, out)
    if paper:
        lines += ["## The paper's numbers beside this run's", "", _paper_block(out, paper), ""]
    lines += ["## Steps", "", "| step | what | status | time |", "|---|---|---|---:|"]
    for step in steps:
        o = outcomes.get(step.name)
        status = o.status if o else "not run"
        lines.append(f"| [{step.name}](#{_anchor(step.title)}) | {step.what} | {status} | "
                     f"{format_duration(o.seconds) if o else '–'} |")
    lines.append("")
    for step in steps:
        lines += _step_section(step, outcomes.get(step.name), out)
    md = out / "index.md"
    md.write_text("\n".join(lines).rstrip() + "\n")
    page = out / "index.html"
    page.write_text(_html(md.read_text(), f"Slapo reproduction (--{plan_name})"))
    return md, page


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


STYLE = ("body{font-family:sans-serif;max-width:1400px;margin:auto;padding:1em}"
         "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;"
         "padding:.2em .5em;vertical-align:top}img{max-width:100%}"
         "td img{max-width:640px}code{background:#f4f4f4}")


def _html(markdown: str, title: str) -> str:
    """The page as HTML (markdown-it-py, CommonMark with tables), headings with anchors."""
    from markdown_it import MarkdownIt

    def heading(match: "re.Match[str]") -> str:
        text = html.unescape(re.sub(r"<[^>]+>", "", match.group(1)))
        return f'<h2 id="{_anchor(text)}">{match.group(1)}</h2>'

    body = MarkdownIt("commonmark").enable("table").render(markdown)
    body = re.sub(r"<h2>(.*?)</h2>", heading, body)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}"
            f"</title><style>{STYLE}</style></head><body>\n{body}</body></html>\n")
