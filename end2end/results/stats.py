"""Repeated measurements on a noisy machine: medians, min-max ranges, and ratios that say when
they are within noise.

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

import statistics
from dataclasses import dataclass
from typing import Iterable, Tuple

__all__ = ["Samples", "Ratio"]


@dataclass(frozen=True)
class Samples:
    """Values of one measurement, as ``(repeat index, value)`` pairs (sorted)."""

    values: Tuple[Tuple[int, float], ...] = ()

    @classmethod
    def of(cls, pairs: Iterable[Tuple[int, float]]) -> "Samples":
        return cls(tuple(sorted((int(r), float(v)) for r, v in pairs)))

    def __len__(self) -> int:
        return len(self.values)

    def __bool__(self) -> bool:
        return bool(self.values)

    @property
    def median(self) -> float:
        return statistics.median(v for _, v in self.values)

    @property
    def lo(self) -> float:
        return min(v for _, v in self.values)

    @property
    def hi(self) -> float:
        return max(v for _, v in self.values)

    def overlaps(self, other: "Samples") -> bool:
        """The two min-max ranges share a point (a single sample is a point)."""
        return self.lo <= other.hi and other.lo <= self.hi

    def ratio(self, other: "Samples") -> "Ratio":
        """``self / other``: median ratio, range, and whether it is within noise."""
        mine, theirs = dict(self.values), dict(other.values)
        repeated = len(self) > 1 and len(other) > 1
        if set(mine) == set(theirs):
            per_round = [mine[r] / theirs[r] for r in mine]
            value, lo, hi = statistics.median(per_round), min(per_round), max(per_round)
            noise = repeated and lo <= 1.0 <= hi
        else:
            value = self.median / other.median
            lo, hi = self.lo / other.hi, self.hi / other.lo
            noise = repeated and self.overlaps(other)
        return Ratio(value, lo, hi, noise, min(len(self), len(other)))


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
