"""Progress lines with an ETA for benchmark sweeps.

    progress = Progress(total=len(runs))
    for spec in runs:
        progress.start(spec.label)      # [3/12] slapo-deepspeed cpu/gpt-neo n=2 bs=4 ... ETA 5m
        ...
        progress.finish("ok")           # [3/12] ok in 21s

Lines go to the ``end2end.sweep`` logger (status: rank 0, stdout; see :mod:`end2end.cli`), or,
when a ``stream`` is given, straight to it.

The ETA is the mean duration of the finished runs times the runs left; with per-run ``weights``
(e.g. estimated seconds), it scales the remaining weight by the measured seconds per weight.
"""

from __future__ import annotations

import time
from typing import Callable, List, Optional, Sequence, TextIO

from end2end.cli import get_logger

__all__ = ["Progress", "format_duration"]


def format_duration(seconds: Optional[float]) -> str:
    """``42s``, ``5m``, ``1h05m``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    hours, rest = divmod(int(round(seconds)), 3600)
    return f"{hours}h{rest // 60:02d}m"


class Progress:
    """Counts runs of a sweep and prints one line when a run starts and one when it ends."""

    def __init__(self, total: int, stream: Optional[TextIO] = None,
                 weights: Optional[Sequence[float]] = None,
                 clock: Callable[[], float] = time.monotonic):
        if weights is not None and len(weights) != total:
            raise ValueError(f"{len(weights)} weights for {total} runs")
        self.total = total
        self.index = 0  # runs started so far
        self.stream = stream  # None: the end2end.sweep logger
        self.weights = list(weights) if weights is not None else [1.0] * total
        self.clock = clock
        self.durations: List[float] = []
        self._done_weight = 0.0
        self._started: Optional[float] = None
        self.begin = clock()

    def eta(self) -> Optional[float]:
        """Seconds left for the runs not yet finished (None before the first finishes)."""
        if not self.durations or self._done_weight <= 0:
            return None
        rate = sum(self.durations) / self._done_weight  # seconds per unit of weight
        return rate * sum(self.weights[len(self.durations):])

    def start(self, label: str) -> str:
        """Print and return ``[i/total] label ... ETA x``."""
        self.index += 1
        self._started = self.clock()
        line = f"[{self.index}/{self.total}] {label} ... ETA {format_duration(self.eta())}"
        self._write(line)
        return line

    def _write(self, line: str) -> None:
        """To ``stream`` if one was given, else a status record of the sweep's logger."""
        if self.stream is None:
            get_logger("end2end.sweep").info(line)
        else:
            print(line, file=self.stream, flush=True)

    def finish(self, status: str = "ok", detail: str = "") -> str:
        """Record the duration of the current run; print and return ``[i/total] status in t``."""
        now = self.clock()
        elapsed = now - (self._started if self._started is not None else now)
        self.durations.append(elapsed)
        position = len(self.durations) - 1
        self._done_weight += self.weights[position] if position < len(self.weights) else 1.0
        self._started = None
        line = f"[{self.index}/{self.total}] {status} in {format_duration(elapsed)}"
        if detail:
            line += f": {detail}"
        self._write(line)
        return line

    def summary(self) -> str:
        """Print and return the total elapsed time."""
        line = (f"finished {len(self.durations)} run(s) in "
                f"{format_duration(self.clock() - self.begin)}")
        self._write(line)
        return line
