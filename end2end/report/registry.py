"""The registry of generated block kinds and what every kind reads its sources with.

A module of kinds registers each with ``@generator("name")`` and imports only this module (and
:mod:`end2end.report.blocks`); :mod:`end2end.report.generators` imports every module of kinds and
renders a block by its kind's name, so the kinds never import the module that renders them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Sequence

from end2end.results.store import ResultRow, read_results

from .blocks import ReportError

__all__ = ["GENERATORS", "generator", "results_path", "result_rows"]

#: Block kind -> ``fn(root, args) -> markdown``.
GENERATORS: Dict[str, Callable[[Path, Sequence[str]], str]] = {}


def generator(name: str):
    """Register ``fn(root, args) -> markdown`` as the block kind ``name``."""

    def deco(fn):
        GENERATORS[name] = fn
        return fn

    return deco


def results_path(root: Path, args: Sequence[str], kind: str) -> Path:
    """The one file among ``args`` (those not starting with ``--``), under ``root``.

    Raises:
        ReportError: not exactly one file, or a file that does not exist.
    """
    files = [a for a in args if not a.startswith("--")]
    if len(files) != 1:
        raise ReportError(f"'{kind}' needs exactly one results file, got {list(args)}",
                          hint=f"e.g. <!-- report: {kind} docs/results/cpu.tsv -->")
    path = root / files[0]
    if not path.is_file():
        raise ReportError(f"results file {files[0]} does not exist",
                          hint="commit it under docs/results/, or fix the path")
    return path


def result_rows(path: Path) -> List[ResultRow]:
    """The rows of the results file ``path``, read strictly (:class:`ReportError`: no rows)."""
    res = read_results(path, strict=True)
    if not res.rows:
        raise ReportError(f"results file {path.name} has no rows", hint="re-run its command")
    return res.rows
