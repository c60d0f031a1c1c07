"""Fill in a column of rows another process appended: the sweep writes its verdict on the machine
(:mod:`end2end.sweep.quiet`) into the rows its run's driver wrote.

The driver appends a run's row itself, before the sweep can know how busy the machine was over
the whole run; afterwards the sweep rewrites the rows appended since the run started (a
:func:`~end2end.results.store.mark`), in the TSV and in the JSON-lines twin, under the append
lock. Only the sweep appends to its results file between the run's end and this rewrite (it
holds :class:`~end2end.sweep.lock.SweepLock`), so nothing else is cut.

A file written before the column existed keeps its columns (older files stay readable and
resumable): there the value goes to the twin only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, List, Optional, Union

from end2end.results.locked_file import append_lock
from end2end.results.store import Mark, twin_path

__all__ = ["annotate_since"]


def _rewrite(path: Path, start: Optional[int], edit: Callable[[str], str]) -> int:
    """Apply ``edit`` to every line of ``path`` from byte ``start`` (None: the whole file, which
    the run created); returns how many lines changed."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    offset = start or 0
    lines = data[offset:].decode("utf-8", errors="surrogateescape").split("\n")
    new = [edit(line) for line in lines]
    changed = sum(a != b for a, b in zip(lines, new))
    if changed:
        with open(path, "r+b") as fh:
            fh.seek(offset)
            fh.truncate()
            fh.write("\n".join(new).encode("utf-8", errors="surrogateescape"))
            fh.flush()
            os.fsync(fh.fileno())
    return changed


def _tsv_editor(path: Path, column: str, value: str) -> Optional[Callable[[str], str]]:
    """An editor that sets ``column`` in a data line of the TSV, or None when the file has no
    such column (written before it existed)."""
    with open(path, errors="replace") as fh:
        header = next((line.rstrip("\n") for line in fh if line.startswith("Impl\t")), "")
    columns: List[str] = header.split("\t")
    if column not in columns:
        return None
    index = columns.index(column)
    cell = " ".join(value.split())  # no tabs or newlines inside a cell

    def edit(line: str) -> str:
        cells = line.split("\t")
        if line.startswith(("#", "Impl\t")) or len(cells) != len(columns):
            return line  # header, or a torn line the reader skips anyway
        cells[index] = cell
        return "\t".join(cells)

    return edit


def annotate_since(path: Union[str, Path], since: Mark, column: str, value: str,
                   extra_key: str, extra: Any) -> int:
    """Set ``column`` to ``value`` in every row of ``path`` appended after ``since``, and
    ``extra[extra_key]`` to ``extra`` in the same rows of the JSON twin. Returns the number of
    TSV rows changed (0 for a file without the column, whose twin still gets the value)."""
    path = Path(path)
    if not path.exists():
        return 0

    def edit_record(line: str) -> str:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return line
        if not isinstance(record, dict) or record.get("type") != "row":
            return line
        record[column] = value
        record.setdefault("extra", {})[extra_key] = extra
        return json.dumps(record, sort_keys=False)

    with append_lock(path):
        editor = _tsv_editor(path, column, value)
        _rewrite(twin_path(path), since[1], edit_record)
        return _rewrite(path, since[0], editor) if editor else 0
