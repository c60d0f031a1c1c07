"""The ``commands SOURCE`` block: how long each of the README's commands took, when, on what
machine and at which commit, derived from the runs' own records (issue 38).

``SOURCE`` (``docs/results/commands.src.tsv``) is a small TSV, typed by hand, that names for each
command the records to derive it from; its columns:

=============  ===================================================================================
``command``    the command as the README gives it
``what``       what it runs
``results``    results files (comma-separated, repository paths) whose rows it wrote
``record``     the command's own wall time: ``LOG#NAME``, the step ``NAME`` of a sitting's log
               (``<time> start NAME ...`` and ``<time> end NAME rc=RC SECONDS s ...`` lines),
               or ``DIR/.reproduce/STEP.json``, the record ``scripts/reproduce.sh`` writes
               for a step it ran (:mod:`end2end.reproduce.runner`); a pattern
               ``DIR/.reproduce/*.json``: every step of the plan, their seconds summed
``measured``   typed cells: what no record holds (e.g. the set-up's wall time, a re-run's
``finished``   wall time); a typed cell is used as it is and marked ``†`` in the table, an empty
``machine``    one is derived
``commit``
=============  ===================================================================================

Derived cells: *measured* is the record's seconds, else the span from the first to the last row's
time stamp (the results file's header time when it is earlier); *finished* the record's end, else
the last row's time; *machine* the CPU model and cores of the results' ``# env`` header and
whether the machine was quiet: the rows' ``Machine`` verdicts (:mod:`end2end.sweep.quiet`), or,
for rows from before that guard, the 1-minute load average at the start of each run (the JSON
twin's ``loadavg_start``) as median and maximum; *commit* the rows' ``GitCommit`` values
(``-dirty`` kept: a run from an uncommitted tree).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from end2end.results.store import ResultRow, read_results, twin_path

from .blocks import ReportError
from .registry import generator, results_path

__all__ = ["COLUMNS", "TYPED_MARK", "read_source", "derive_line", "commands_markdown"]

#: The source's columns, in order.
COLUMNS = ("command", "what", "results", "record", "measured", "finished", "machine", "commit")
#: The table's columns: the source's first two, then the derived (or typed) four.
SHOWN = ("command", "what", "measured", "finished", "machine", "commit")
TYPED_MARK = " †"
_END = re.compile(r"^(?P<time>\S+) end (?P<name>.+?) rc=(?P<rc>-?\d+) (?P<seconds>\d+(?:\.\d+)?) s")


def read_source(path: Path) -> List[Dict[str, str]]:
    """The lines of ``path`` (``#`` lines are comments; the first other line is the header).

    Raises:
        ReportError: a header that is not :data:`COLUMNS`, or a line with more cells.
    """
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    if not lines or tuple(lines[0].split("\t")) != COLUMNS:
        raise ReportError(f"{path.name}: the header line must be the tab-separated columns "
                          f"{' '.join(COLUMNS)}", hint="see end2end/report/commands_table.py")
    out = []
    for n, line in enumerate(lines[1:], start=2):
        cells = line.split("\t")
        if len(cells) > len(COLUMNS):
            raise ReportError(f"{path.name}: line {n} has {len(cells)} cells, at most "
                              f"{len(COLUMNS)}", hint="one tab between cells, none inside")
        out.append(dict(zip(COLUMNS, cells + [""] * (len(COLUMNS) - len(cells)))))
    return out


def duration_text(seconds: float) -> str:
    """``1 h 2 min``, ``21 min 37 s``, ``45 s``."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


def _stamp(text: str) -> str:
    """``2026-12-02T02:53:38+00:00`` -> ``2026-12-02 02:53`` (the records are in UTC)."""
    return f"{text[:10]} {text[11:16]}"


def _seconds(text: str) -> float:
    from datetime import datetime, timezone

    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def _reproduce_record(path: Path) -> Tuple[str, float, int]:
    """A step record of ``scripts/reproduce.sh`` (``{"status", "seconds", "finished": "YYYY-MM-DD
    HH:MM UTC", ...}``) as ``(end time, seconds, 0 or 1)``."""
    try:
        data = json.loads(path.read_text())
        end = str(data["finished"]).replace(" UTC", "").replace(" ", "T") + ":00+00:00"
        return end, float(data["seconds"]), 0 if data["status"] == "ok" else 1
    except (OSError, ValueError, KeyError, TypeError):
        raise ReportError(f"{path.name} is not a step record of scripts/reproduce.sh",
                          hint="name DIR/.reproduce/STEP.json of a finished step") from None


def read_record(root: Path, spec: str) -> Tuple[str, float, int]:
    """``(end time, seconds, exit code)`` of the step ``NAME`` in ``LOG#NAME``, or of a
    reproduce step record (``.json``).

    Raises:
        ReportError: no ``#``, a missing log, or no ``end NAME`` line in it.
    """
    if spec.endswith(".json") and "*" in spec:  # every step of a plan: their sum
        found = [_reproduce_record(path) for path in sorted(root.glob(spec))]
        if not found:
            raise ReportError(f"record {spec!r}: no step record matches",
                              hint="e.g. docs/results/reproduce-full/.reproduce/*.json")
        return (max(end for end, _, _ in found), sum(sec for _, sec, _ in found),
                max(rc for _, _, rc in found))
    if spec.endswith(".json") and "#" not in spec:
        return _reproduce_record(root / spec)
    log, _, name = spec.partition("#")
    path = root / log
    if not name or not path.is_file():
        raise ReportError(f"record {spec!r}: expected LOG#STEP with LOG a committed file, or "
                          "a reproduce step record DIR/.reproduce/STEP.json",
                          hint="e.g. docs/results/sitting.log#cpu")
    for line in path.read_text().splitlines():
        match = _END.match(line)
        if match and match["name"] == name:
            return match["time"], float(match["seconds"]), int(match["rc"])
    raise ReportError(f"{log} has no line '<time> end {name} rc=RC SECONDS s'",
                      hint="name a step the log ends, or type the cells in the source")


def _start_loads(path: Path) -> List[float]:
    """The 1-minute load average at the start of each run, from the JSON twin's rows."""
    twin, loads = twin_path(path), []
    if twin.is_file():
        for line in twin.read_text().splitlines():
            try:
                record = json.loads(line)
                loads.append(float(record["extra"]["loadavg_start"][0]))
            except (ValueError, KeyError, TypeError, IndexError):
                continue
    return loads


def _machine(rows: Sequence[ResultRow], env: Dict, loads: Sequence[float]) -> str:
    cores = env.get("cpu_affinity") or env.get("cpu_count") or "?"
    where = f"{env.get('cpu_model', 'an unrecorded machine')}, {cores} cores"
    watched = [r for r in rows if r.machine]
    if watched:
        busy = sum(r.machine.startswith("busy") for r in watched)
        return (f"{where}; busy in {busy} of {len(watched)} runs" if busy else
                f"{where}; quiet in all {len(watched)} runs")
    if loads:
        return (f"{where}; not watched (1-min load at run start: median "
                f"{statistics.median(loads):.1f}, max {max(loads):.1f})")
    return where


def _commits(rows: Sequence[ResultRow]) -> str:
    found = sorted({r.git_commit[:7] + ("-dirty" if r.git_commit.endswith("-dirty") else "")
                    for r in rows if r.git_commit})
    return ", ".join(found) or "unrecorded"


def derive_line(root: Path, line: Dict[str, str]) -> Dict[str, str]:
    """The table's cells of one source line: typed cells marked, the others derived."""
    derived = dict.fromkeys(("measured", "finished", "machine", "commit"), "")
    files = [f.strip() for f in line["results"].split(",") if f.strip()]
    rows: List[ResultRow] = []
    env: Dict = {}
    loads: List[float] = []
    times: List[str] = []
    for name in files:
        path = results_path(root, [name], "commands")
        res = read_results(path, strict=True)
        rows += res.rows
        env = env or res.env
        loads += _start_loads(path)
        times += [t for t in [res.env.get("time", "")] + [r.time for r in res.rows] if t]
    if rows:
        times.sort(key=_seconds)
        derived.update(measured=f"{duration_text(_seconds(times[-1]) - _seconds(times[0]))} "
                                "(first to last row)",
                       finished=_stamp(times[-1]), machine=_machine(rows, env, loads),
                       commit=_commits(rows))
    if line["record"]:
        end, seconds, rc = read_record(root, line["record"])
        derived.update(measured=duration_text(seconds) + (f" (exit {rc})" if rc else ""),
                       finished=_stamp(end))
    cells = {k: line[k] for k in ("command", "what")}
    for key, value in derived.items():
        typed = line[key].strip()
        if not typed and not value:
            raise ReportError(f"the command {line['command']} has no {key}: no results file "
                              "or record gives it", hint="name its results or record, or "
                              "type the cell in the source")
        cells[key] = typed + TYPED_MARK if typed else value
    return cells


def commands_markdown(root: Path, source: Path) -> str:
    """The table of every line of ``source`` and a note on where its cells come from."""
    table = ["| " + " | ".join(SHOWN[:3] + ("finished (UTC)",) + SHOWN[4:]) + " |",
             "|" + "---|" * len(SHOWN)]
    for line in read_source(source):
        cells = derive_line(root, line)
        table.append("| " + " | ".join(cells[k].replace("|", "\\|") for k in SHOWN) + " |")
    rel = source.relative_to(root) if source.is_relative_to(root) else source
    note = ("Derived from each command's own records: its results files' rows (time stamps, "
            "machine, commit) and the sitting's log (the wall time, when it has the step); "
            f"cells marked † are typed in `{rel}`: what no record holds.")
    return "\n".join(table) + "\n\n" + note


@generator("commands")
def _commands(root: Path, args: Sequence[str]) -> str:
    return commands_markdown(root, results_path(root, args, "commands"))
