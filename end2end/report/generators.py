"""The kinds of generated block, each a function of committed files only (no clock, no machine).

=========================  ===============================================================
``modes``                  the table of modes (:func:`end2end.spec.modes.modes_markdown`)
``results FILE [--peers]`` the table of a results file: samples/s per system as median
                           (min-max) over its rounds, and each Slapo/baseline ratio as the
                           median of the per-round ratios with their range
                           (:func:`end2end.results.summary.format_markdown`); ``--peers``: the
                           PyTorch-peers systems only
``best FILE``              per workload and rank count, the best Slapo bar against the best
                           baseline bar (the paper's conclusion), each at its best setting
``tsv FILE``               a plain TSV with a header line as a table (with the count of each
                           ``status`` when it has that column; ``#`` lines skipped;
                           ``--columns=a,b`` only those columns)
``validation FILE``        published GPU measurements vs the simulator's predictions
                           (:mod:`end2end.report.validation_table`); ``validation-sources``
                           the set's source table
``provenance FILE``        one line saying where the numbers of ``FILE`` come from: the
                           date and UTC time span of its rows, the machine (CPU model and
                           cores) and commit(s) from its ``# env`` header and rows, the package
                           versions, and the command that made it (``FILE`` with the suffix
                           ``.cmd``: one command per line, committed beside it)
``commands SOURCE``        how long each of the README's commands took, when, where and at
                           which commit, from the runs' own records
                           (:mod:`end2end.report.commands_table`)
=========================  ===============================================================

``FILE`` is relative to the repository root. Add a kind with ``@generator("name")``
(:mod:`end2end.report.registry`) in a module that this one imports.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Dict, Sequence

from slapo.errors import SlapoError

from end2end.results.store import read_results

from . import (commands_table, paper, predicted, proof_table, studies,  # noqa: F401  (kinds)
               validation_table)
from .blocks import Block, ReportError
from .registry import GENERATORS, generator, result_rows, results_path

__all__ = ["render"]


def render(root: Path, block: Block) -> str:
    """The text of ``block`` as its kind makes it now.

    Raises:
        ReportError: an unknown kind, wrong arguments, or a source that is missing or unreadable
            (with the block's ``file:line``).
    """
    if block.name not in GENERATORS:
        raise ReportError(f"{block.where}: unknown report block kind {block.name!r}",
                          hint=f"kinds: {', '.join(sorted(GENERATORS))}")
    try:
        return GENERATORS[block.name](root, block.args)
    except SlapoError as exc:  # the results store's and summary's errors too
        raise ReportError(f"{block.where}: {exc.what}", hint=exc.hint) from None


@generator("modes")
def _modes(root: Path, args: Sequence[str]) -> str:
    from end2end.spec.modes import modes_markdown

    if args:
        raise ReportError(f"'modes' takes no arguments, got {list(args)}",
                          hint="<!-- report: modes -->")
    return modes_markdown()


@generator("results")
def _results(root: Path, args: Sequence[str]) -> str:
    from end2end.results.summary import (GROUPS, busy_note, figure7_table, format_markdown,
                                         is_predicted, speedups)
    from end2end.spec.modes import PEER_GROUPS

    unknown = [a for a in args if a.startswith("--") and a != "--peers"]
    if unknown:
        raise ReportError(f"unknown option(s) {unknown} of 'results'", hint="only --peers")
    peers = "--peers" in args
    rows = result_rows(results_path(root, args, "results"))
    if peers:
        rows = [r for r in rows if r.impl in PEER_GROUPS[0]]
    table = figure7_table(rows)
    rounds = sorted({r.repeat for r in rows})
    if is_predicted(rows):
        note = ("Predicted samples/s of the whole job (simulated: no run measured them); a "
                "ratio of two predictions is never paired with a measurement.")
    else:
        note = (f"Samples/s of the whole job: median (min-max) over {len(rounds)} interleaved "
                "round(s); a ratio is the median of the per-round ratios (min-max), `~` when "
                "its rounds straddle 1.0 (within noise).")
    note = " ".join(filter(None, [note, busy_note(table)]))
    return (format_markdown(table, speedups(table), PEER_GROUPS if peers else GROUPS)
            + "\n\n" + note)


@generator("best")
def _best(root: Path, args: Sequence[str]) -> str:
    """Per workload and rank count, the best Slapo bar against the best baseline bar (the
    paper's conclusion), beside the paired statistics of the ``results`` block."""
    from end2end.results.summary import (BASELINES, BUSY_MARK, busy_note, figure7_table,
                                         is_slapo_system, label_of, ratio_text, speedups)

    rows = result_rows(results_path(root, args, "best"))
    table = figure7_table(rows, best=True)
    lines = ["| Model (seq), n | best Slapo | best baseline | best / best |",
             "|---|---|---|---:|"]
    for item in speedups(table):
        if item.system != "best-slapo":
            continue
        cells = table[item.panel][item.n]
        top = max((s for s in cells if is_slapo_system(s) and cells[s].thrpt),
                  key=lambda s: cells[s].thrpt)
        ref = max((s for s in cells if s in BASELINES and cells[s].thrpt),
                  key=lambda s: cells[s].thrpt)
        seq = f"{item.panel.seq}" + (f"/{item.panel.dec_seq}" if item.panel.dec_seq else "")
        lines.append(f"| `{item.panel.model}` ({seq}), {item.n} | {label_of(top)} "
                     f"{cells[top].thrpt:.3g} | {label_of(ref)} {cells[ref].thrpt:.3g} | "
                     f"{ratio_text(item.ratio)}"
                     f"{BUSY_MARK if cells[top].busy or cells[ref].busy else ''} |")
    note = ("Each side at its best system and setting (batch, ckpt), as the paper's Figure 7 "
            "compares; samples/s are medians over the rounds, the ratio as in the table above.")
    return "\n".join(lines) + "\n\n" + " ".join(filter(None, [note, busy_note(table)]))


@generator("tsv")
def _tsv(root: Path, args: Sequence[str]) -> str:
    """A plain TSV with a header line as a Markdown table (``|`` escaped), preceded by the count
    of each value of its ``status`` column when it has one. Lines starting with ``#`` are
    comments (skipped); ``--columns a,b,c`` shows only those columns, in that order."""
    columns = [a.split("=", 1)[1].split(",") for a in args if a.startswith("--columns=")]
    unknown = [a for a in args if a.startswith("--") and not a.startswith("--columns=")]
    if unknown:
        raise ReportError(f"unknown option(s) {unknown} of 'tsv'", hint="only --columns=a,b,c")
    path = results_path(root, [a for a in args if not a.startswith("--")], "tsv")
    lines = [line.split("\t") for line in path.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    if len(lines) < 2:
        raise ReportError(f"{path.name} has no header line and rows",
                          hint="first line: the column names, tab-separated")
    head, rows = lines[0], lines[1:]
    cell = [[c.replace("|", "\\|") for c in row + [""] * (len(head) - len(row))]
            for row in rows]
    out = []
    if "status" in head:
        counts: Dict[str, int] = {}
        for row in cell:
            counts[row[head.index("status")]] = counts.get(row[head.index("status")], 0) + 1
        out.append(", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
                   + f" (of {len(cell)})\n")
    shown = columns[-1] if columns else head
    missing = [c for c in shown if c not in head]
    if missing:
        raise ReportError(f"{path.name} has no column(s) {missing}",
                          hint=f"its columns: {', '.join(head)}")
    index = [head.index(c) for c in shown]
    out.append("| " + " | ".join(shown) + " |")
    out.append("|" + "---|" * len(shown))
    out += ["| " + " | ".join(row[i] for i in index) + " |" for row in cell]
    return "\n".join(out)


@generator("provenance")
def _provenance(root: Path, args: Sequence[str]) -> str:
    from end2end.results.summary import is_predicted

    path = results_path(root, args, "provenance")
    res = read_results(path, strict=True)
    command_file = path.with_suffix(".cmd")
    if not command_file.is_file():
        raise ReportError(f"{path.name} has no {command_file.name} beside it",
                          hint=f"write the command that made it into {command_file.name}")
    commands = [" ".join(shlex.split(line)) for line in command_file.read_text().splitlines()
                if line.strip()]
    times = sorted(r.time for r in res.rows if r.time)
    commits = sorted({r.git_commit for r in res.rows if r.git_commit} or
                     {res.env.get("git_commit", "unknown")})
    env = res.env
    span = f"{times[0][:10]} {times[0][11:16]}-{times[-1][11:16]} UTC" if times else "undated"
    cores = env.get("cpu_affinity") or env.get("cpu_count") or "?"
    versions = ", ".join(f"{name} {env[key]}" for name, key in
                         (("torch", "torch"), ("transformers", "transformers"),
                          ("DeepSpeed", "deepspeed"), ("megatron-core", "megatron_core"))
                         if env.get(key))
    verb = "Simulated (predictions, not measurements)" if is_predicted(res.rows) else "Measured"
    return (f"{verb} {span} on {env.get('cpu_model', 'an unrecorded machine')} "
            f"({cores} cores), commit {', '.join(commits)}; {versions}; {len(res.rows)} rows "
            f"in [`{path.relative_to(root)}`]({_link(path, root)}), made by "
            + ", then ".join(f"`{c}`" for c in commands) + ".")


def _link(path: Path, root: Path) -> str:
    return "/" + str(path.relative_to(root))

