"""Benchmark results: one row per run, appended to a TSV and its JSON-lines twin.

The TSV keeps the artifact's 11 columns first (so its plot scripts still read it) and adds::

    Impl Model Seq DecSeq nGPU Batch Ckpt PerGPUParam Thrpt PerGPUMem PerGPUTFLOPS
    Status MFU StepTime PeakTFLOPS GitCommit Torch Transformers DeepSpeed MegatronCore Device
    World TP PP DP Dtype Steps Time Error Knobs Repeat Machine Resumed

Units: PerGPUParam in millions, Thrpt samples/s (all ranks), PerGPUMem GB (peak per rank),
PerGPUTFLOPS model TFLOP/s per rank, MFU a fraction of PeakTFLOPS (the GEMM rate measured in the
same run), StepTime seconds, Machine whether the machine was quiet while the run was measured
(``quiet (...)``/``busy (...)`` from :mod:`end2end.sweep.quiet`, ``""`` when not watched),
Resumed ``from step K`` for a run continued from a saved state (``--resume``; its Steps are the
run's, of which it trained those after K), ``""`` for an uninterrupted one. A
run that did not produce a throughput is still a row: ``Status`` is
``oom``/``fail``/``timeout``/``skipped`` with the reason in ``Error`` and ``na`` metrics — never
a silent zero. The file starts with ``#`` lines holding the environment dump (JSON).

Appends are atomic enough for a crash: one ``write`` per row under the append lock (a
``filelock`` sidecar, ``results.tsv.append.lock``: :mod:`end2end.results.locked_file`), then
``flush`` + ``fsync``; the JSON-lines twin (``results.jsonl`` next to ``results.tsv``) is written
first. A torn last line (killed mid-write) is skipped by the reader with a warning.

Reading is by line, not ``pandas.read_csv``: a damaged line must cost that line only, with a
``file:line`` warning (an error when ``strict``), which read_csv cannot do (it decodes the file
as a whole, reports a bad row without its line, pads a short one). The rows read become a typed
DataFrame for aggregation in :mod:`end2end.results.stats` (``to_frame``, ``results_frame``).
The row itself (columns, :class:`ResultRow`, cells) is :mod:`end2end.results.row`, re-exported
here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

from end2end.spec.config_file import RunSpec, run_key
from end2end.results.locked_file import append_lock, append_line, read_locked
from end2end.results.row import (ARTIFACT_COLUMNS, COLUMN_TYPES, COLUMNS, NA, SIMULATED_STATUSES,
                                 STATUSES, ResultRow, ResultsError, _canonical_ckpt, _cell,
                                 _COLUMN_OF, _FIELDS, _json_value, _row_from_cells, env_columns)

__all__ = [
    "COLUMNS", "ARTIFACT_COLUMNS", "STATUSES", "ResultsError", "ResultRow", "Results",
    "append_result", "read_results", "pending_runs", "done_keys", "twin_path", "env_columns",
    "COLUMN_TYPES", "SIMULATED_STATUSES", "NA", "Mark", "mark", "rollback",
]

MAGIC = "# slapo-results v1"


def twin_path(path: Union[str, Path]) -> Path:
    """The JSON-lines twin of a results TSV (``x.tsv`` -> ``x.jsonl``)."""
    return Path(path).with_suffix(".jsonl")


def _tsv_header(env: Optional[Dict[str, Any]]) -> str:
    lines = [MAGIC]
    if env:
        lines.append("# env " + json.dumps(env, sort_keys=True))
    lines.append("\t".join(COLUMNS))
    return "\n".join(lines) + "\n"


def append_result(path: Union[str, Path], row: ResultRow,
                  env: Optional[Dict[str, Any]] = None) -> None:
    """Validate ``row`` and append it to ``path`` (TSV) and its JSON-lines twin.

    ``env`` (an ``env_dump()``) goes into the header when the file is created.
    """
    row.validate()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size:
        with open(path, errors="replace") as fh:
            head = [fh.readline() for _ in range(3)]
        cols = next((h.rstrip("\n") for h in head if h.startswith("Impl\t")), "")
        columns = _writable_columns(path, tuple(cols.split("\t")) if cols else COLUMNS, row)
    else:
        columns = COLUMNS
    record = {"type": "row", **{col: _json_value(getattr(row, f.name))
                                for f, col in zip(_FIELDS, COLUMNS)}, "extra": row.extra}
    env_line = json.dumps({"type": "env", **env}, sort_keys=True) + "\n" if env else ""
    with append_lock(path):
        append_line(twin_path(path), json.dumps(record, sort_keys=False), header=env_line)
        append_line(path, "\t".join(_cell(getattr(row, f.name)) for f in _FIELDS[:len(columns)]),
                    header=_tsv_header(env))


Mark = Tuple[Optional[int], Optional[int]]


def mark(path: Union[str, Path]) -> Mark:
    """The sizes of a results file and its twin (None: absent), for :func:`rollback`."""
    path = Path(path)
    return tuple(p.stat().st_size if p.exists() else None for p in (path, twin_path(path)))


def rollback(path: Union[str, Path], to: Mark) -> bool:
    """Cut a results file and its twin back to a :func:`mark` (deleting files that did not
    exist), under the append lock: the rows of an interrupted run, complete or torn, are gone
    and the run is pending again. Returns whether anything was removed. Only safe while this
    process is the only writer (the sweep holds :class:`~end2end.sweep.lock.SweepLock`)."""
    path = Path(path)
    if mark(path) == to:
        return False
    with append_lock(path):
        for file, size in ((path, to[0]), (twin_path(path), to[1])):
            if size is None:
                file.unlink(missing_ok=True)
            elif file.exists() and file.stat().st_size > size:
                os.truncate(file, size)
    return True


def _writable_columns(path: Path, columns: Tuple[str, ...], row: ResultRow) -> Tuple[str, ...]:
    """The columns to write ``row`` into an existing file: its own, when they are ours up to
    columns added later (``Knobs``, ``Repeat``, ``Machine``, ``Resumed``) and the row leaves
    those at their defaults."""
    if columns == COLUMNS:
        return columns
    missing = _FIELDS[len(columns):]
    if COLUMNS[:len(columns)] != columns or len(columns) < len(ARTIFACT_COLUMNS):
        raise ResultsError(f"{path} has different columns", hint="write to a new file")
    if any(getattr(row, f.name) != f.default for f in missing):
        raise ResultsError(f"{path} predates the column(s) "
                           f"{', '.join(_COLUMN_OF[f.name] for f in missing)}, which this run "
                           "needs", hint="write to a new results file")
    return columns


@dataclass
class Results:
    """Rows of a results file, its environment header and any problems found while reading."""

    rows: List[ResultRow]
    env: Dict[str, Any]
    warnings: List[str]

    def ok(self) -> List[ResultRow]:
        return [r for r in self.rows if r.status == "ok"]


def read_results(path: Union[str, Path], strict: bool = False,
                 check_twin: bool = True) -> Results:
    """Load and validate a results TSV (ours, or the artifact's 11-column format).

    Malformed lines (e.g. a torn last line) are skipped and reported in ``warnings``, or raise
    :class:`ResultsError` with ``file:line`` when ``strict``. With ``check_twin`` the JSON-lines
    twin, if present, must hold the same runs in the same order (else a warning).
    """
    path = Path(path)
    problems: List[str] = []
    twin = twin_path(path)
    try:
        data, twin_data = read_locked(path, twin if check_twin else None)
    except OSError as exc:
        raise ResultsError(f"cannot read results {str(path)!r}: {exc.strerror}") from None
    lines = _decode_lines(path, data, problems, strict)
    rows: List[ResultRow] = []
    env: Dict[str, Any] = {}
    columns: Optional[List[str]] = None
    for lineno, line in enumerate(lines, start=1):
        where = f"{path}:{lineno}"
        if line is None:  # not UTF-8: reported by _decode_lines
            continue
        if line.startswith("# env "):
            try:
                env = json.loads(line[6:])
            except json.JSONDecodeError as exc:
                msg = f"{where}: skipped damaged '# env' line ({exc.msg})"
                if strict:
                    raise ResultsError(msg) from None
                problems.append(msg)
            continue
        if columns is None:
            if line.startswith("Impl\t") or line.split()[:1] == ["Impl"]:
                columns = line.split("\t") if "\t" in line else line.split()
            continue  # preamble (artifact env dump) before the header
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        try:
            if len(cells) != len(columns):
                raise ValueError(f"{len(cells)} fields, expected {len(columns)}")
            row = _row_from_cells(cells, columns)
            row.validate()
        except (ValueError, TypeError, ResultsError) as exc:
            msg = f"{where}: skipped malformed row ({exc})"
            if strict:
                raise ResultsError(msg, hint="a torn last line comes from a killed run") from None
            problems.append(msg)
            continue
        rows.append(row)
    if columns is None and lines:
        raise ResultsError(f"{path}: no header line starting with 'Impl'")
    if twin_data is not None:
        problems += _check_twin(twin, twin_data, rows)
    return Results(rows, env, problems)


def _decode_lines(path: Path, data: bytes, problems: List[str],
                  strict: bool = False) -> List[Optional[str]]:
    """Lines of ``data`` (UTF-8, a BOM dropped); a line that is not UTF-8 becomes None and a
    ``file:line`` warning (an error when ``strict``), so one bad byte loses one line only."""
    lines: List[Optional[str]] = []
    for lineno, raw in enumerate(data.removeprefix(b"\xef\xbb\xbf").splitlines(), start=1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            msg = (f"{path}:{lineno}: skipped a line that is not UTF-8 (byte "
                   f"{raw[exc.start]:#04x} at column {exc.start + 1})")
            if strict:
                raise ResultsError(msg, hint="results files are written as UTF-8; the line "
                                   "was damaged after it was written") from None
            problems.append(msg)
            lines.append(None)
    return lines


def _check_twin(twin: Path, data: bytes, rows: List[ResultRow]) -> List[str]:
    keys = []
    problems: List[str] = []
    for lineno, line in enumerate(_decode_lines(twin, data, problems), start=1):
        if line is None:
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or rec.get("type") != "row":
                continue
            keys.append(run_key(rec["Impl"], rec["Model"], rec["Seq"], rec["DecSeq"],
                                rec["nGPU"], rec["Batch"], _canonical_ckpt(rec["Ckpt"]),
                                rec.get("TP"), rec.get("PP"), rec.get("Knobs", ""),
                                rec.get("Repeat", 0)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            problems.append(f"{twin}:{lineno}: skipped malformed JSON line")
    if keys != [r.key for r in rows]:
        problems.append(f"{twin}: {len(keys)} rows do not match the {len(rows)} rows of the TSV "
                        "(a run was interrupted between the two writes?)")
    return problems


def done_keys(rows: Iterable[ResultRow], retry: Iterable[str] = (),
              devices: Optional[int] = None) -> Set[tuple]:
    """Keys of runs that are done: any row whose status is not in ``retry``; with ``devices``,
    a ``skipped`` row (not enough devices) counts only while its run still needs more."""
    retry = set(retry)
    return {r.key for r in rows if r.status not in retry
            and not (r.status == "skipped" and devices is not None and r.ngpu <= devices)}


def pending_runs(specs: Sequence[RunSpec], results: Union[str, Path, Results, None],
                 retry_failed: bool = False, retry: Iterable[str] = (),
                 devices: Optional[int] = None) -> List[RunSpec]:
    """The runs of ``specs`` that still have to run, in order (resume after an interruption).

    Every row counts as done — including ``fail``/``oom``/``timeout``/``skipped`` — unless its
    status is in ``retry``; ``retry_failed`` adds ``fail`` and ``timeout`` to ``retry``. With
    ``devices`` (the devices available now), a run ``skipped`` for lack of devices is pending
    again once it fits: the reason for the skip is gone.
    """
    if results is None or (not isinstance(results, Results) and not Path(results).exists()):
        return list(specs)
    res = results if isinstance(results, Results) else read_results(results)
    statuses = set(retry) | ({"fail", "timeout"} if retry_failed else set())
    unknown = statuses - set(STATUSES)
    if unknown:
        raise ResultsError(f"unknown statuses to retry: {sorted(unknown)}",
                           hint=f"statuses are {', '.join(STATUSES)}")
    done = done_keys(res.rows, statuses, devices)
    return [s for s in specs if s.key not in done]
