"""Repeated measurements on a noisy machine, with pandas: the results as a typed DataFrame,
medians, min-max ranges, and ratios that say when they are within noise.

:func:`to_frame` turns results rows into a DataFrame (the TSV's columns; numbers as floats,
``na`` as NaN), :func:`results_frame` reads files into one; the figures and tables group and
aggregate these frames (:mod:`end2end.results.summary`, ``ablation/``).

A sweep with ``--repeat R`` measures every run R times in interleaved rounds (every line once,
then every line again), so drift hits every system alike. :class:`Samples` holds the values of
one run by repeat index; :meth:`Samples.ratio` compares two runs: the ratio, its range, and
whether it is "within noise" (not a result, ``notes/design.md`` §6):

* rounds measured side by side pair up: the ratio is the median of the per-round ratios, the
  range is theirs, and the ratio is within noise when that range includes 1.0 (one system is not
  ahead in every round). A machine whose speed drifts between rounds widens both systems' ranges
  alike; the per-round ratio sees through it (two bars whose ranges overlap because the whole
  machine slowed down in one round can still be 0.86-0.89x in every round), and its median is
  the paired estimate (the ratio of the two medians mixes rounds: with six rounds at 1.06, 0.81,
  1.33, 1.12, 1.03, 0.97 it was 0.98x, below four of the six);
* otherwise (rounds that do not match) the ratio is that of the medians, the range the widest
  the samples allow, and the ratio is within noise when the two systems' min-max ranges
  overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence, Tuple, Union

from end2end.results.store import COLUMN_TYPES, COLUMNS, ResultRow, read_results

if TYPE_CHECKING:  # pandas is imported where it is used: the driver's ranks import this module
    import pandas as pd

__all__ = ["Samples", "Ratio", "to_frame", "results_frame", "FRAME_TYPES"]

# The frame's column types: a column every row has as an int stays int64; the other numeric
# columns (Thrpt, MFU, TP, ...) may be ``na`` and are float64 with NaN there; text is str.
FRAME_TYPES = {col: {"int": "int64", "number": "float64", "text": "str"}[kind]
               for col, kind in COLUMN_TYPES.items()}


_ATTRS = [f.name for f in fields(ResultRow) if f.name != "extra"]  # in the order of COLUMNS


def to_frame(rows: Iterable[ResultRow]) -> "pd.DataFrame":
    """``rows`` as a DataFrame, one row each in order, columns named as in the TSV
    (``COLUMNS``) and typed by ``FRAME_TYPES`` (the JSON twin's ``extra`` is left out)."""
    import pandas as pd

    frame = pd.DataFrame([[getattr(r, name) for name in _ATTRS] for r in rows],
                         columns=list(COLUMNS))
    return frame.astype(FRAME_TYPES)


def results_frame(paths: Union[str, Path, Sequence[Union[str, Path]]], strict: bool = False,
                  check_twin: bool = True) -> "pd.DataFrame":
    """The rows of results files (:func:`~end2end.results.store.read_results`) as one
    :func:`to_frame` frame, file after file, with a ``File`` column. A file's warnings (damaged
    lines, skipped) go to the ``end2end.results`` logger (``warning: file:line: ...``)."""
    import pandas as pd

    from end2end.cli import get_logger

    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    frames = []
    for path in paths:
        res = read_results(path, strict=strict, check_twin=check_twin)
        for warning in res.warnings:
            get_logger("end2end.results").warning("warning: %s", warning)
        frames.append(to_frame(res.rows).assign(File=str(path)))
    if not frames:
        return to_frame([]).assign(File=pd.Series(dtype="str"))
    return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True)
class Samples:
    """Values of one measurement, as ``(repeat index, value)`` pairs (sorted); :attr:`series`
    is the same as a pandas Series indexed by repeat."""

    values: Tuple[Tuple[int, float], ...] = ()

    @classmethod
    def of(cls, pairs: Iterable[Tuple[int, float]]) -> "Samples":
        return cls(tuple(sorted((int(r), float(v)) for r, v in pairs)))

    @cached_property
    def series(self) -> "pd.Series":
        import pandas as pd

        return pd.Series([v for _, v in self.values], dtype="float64",
                         index=pd.Index([r for r, _ in self.values], name="Repeat"))

    def __len__(self) -> int:
        return len(self.values)

    def __bool__(self) -> bool:
        return bool(self.values)

    @property
    def median(self) -> float:
        return float(self.series.median())

    @property
    def lo(self) -> float:
        return float(self.series.min())

    @property
    def hi(self) -> float:
        return float(self.series.max())

    def overlaps(self, other: "Samples") -> bool:
        """The two min-max ranges share a point (a single sample is a point)."""
        return self.lo <= other.hi and other.lo <= self.hi

    def ratio(self, other: "Samples") -> "Ratio":
        """``self / other``: median ratio, range, and whether it is within noise."""
        mine, theirs = _by_round(self.series), _by_round(other.series)
        repeated = len(self) > 1 and len(other) > 1
        if mine.index.equals(theirs.index):  # the same rounds: pair them
            per_round = (mine / theirs).agg(["median", "min", "max"])
            value, lo, hi = (float(x) for x in per_round)
            noise = repeated and lo <= 1.0 <= hi
        else:
            value = self.median / other.median
            lo, hi = self.lo / other.hi, self.hi / other.lo
            noise = repeated and self.overlaps(other)
        return Ratio(value, lo, hi, noise, min(len(self), len(other)))


def _by_round(series: "pd.Series") -> "pd.Series":
    """One value per round (the last, where a repeat index appears twice)."""
    return series.groupby(level=0).last()


@dataclass(frozen=True)
class Ratio:
    """A speedup: the median of the paired per-round ratios (else the ratio of the medians), the
    range of the ratio, whether it is within noise and the number of repeats behind it."""

    value: float
    lo: float
    hi: float
    within_noise: bool = False
    repeats: int = 1

    @property
    def label(self) -> str:
        """What a bar carries: ``1.23x``, or ``~`` when within noise."""
        return "~" if self.within_noise else f"{self.value:.2f}x"

    def __str__(self) -> str:
        if self.repeats < 2:
            return f"{self.value:.2f}x"
        text = f"{self.value:.2f}x ({self.lo:.2f}-{self.hi:.2f}, {self.repeats} repeats)"
        return text + (" ~ within noise" if self.within_noise else "")
