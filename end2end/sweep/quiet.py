"""Was the machine quiet while a run was measured? (issue 38: a quiet-machine guard.)

The CPU benchmarks share their cores with whatever else runs on the machine; a round measured
beside another busy process can move a ratio by more than the difference it reports. The sweep
therefore watches the machine around every run (:class:`Watch`) and writes the verdict into the
run's row (column ``Machine``: ``quiet (...)`` or ``busy (...)``, the numbers in the JSON twin's
``extra["machine"]``); the tables mark a number measured while the machine was busy with ``!``.

What counts, from ``/proc`` before and after the run:

* **others' CPU**: the machine's busy CPU time (``/proc/stat``) less the CPU time of the sweep and
  of every process it started and reaped (``os.times()``'s children: the launcher, the ranks and
  their helpers), as a fraction of all cores over the run's wall time;
* **steal**: the CPU time the hypervisor gave to other guests, as a fraction of all CPU time;
* **busy processes**: other processes that used at least :data:`BUSY_PROCESS` of a core over the
  run (the three busiest named with pid and share in the cell, all of them in the twin);
* the 1-minute **load average** before and after (recorded, not judged: it counts the run's own
  ranks and lags by a minute).

A run is *busy* when others used more than :data:`OTHERS_MAX` of the machine, steal exceeded
:data:`STEAL_MAX`, or any other process was busy. ``--require-quiet`` (:func:`wait_until_quiet`)
probes the machine before every run and waits, bounded, for it to become quiet, or refuses in
one line naming what keeps it busy.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from slapo.errors import ConfigError

from end2end.results.annotate import annotate_since
from end2end.results.store import Mark

__all__ = ["Snapshot", "Verdict", "Watch", "snapshot", "judge", "probe", "wait_until_quiet",
           "record_verdict", "MachineBusy", "OTHERS_MAX", "STEAL_MAX", "BUSY_PROCESS"]

OTHERS_MAX = 0.10  # others may use at most 10% of all cores over a run
STEAL_MAX = 0.05  # at most 5% of the CPU time stolen by the hypervisor
BUSY_PROCESS = 0.10  # another process using a tenth of a core or more is "busy"
PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class MachineBusy(ConfigError):
    """``--require-quiet``: the machine stayed busy for longer than the sweep may wait."""


@dataclass(frozen=True)
class Snapshot:
    """The machine at one moment: wall clock, ``/proc/stat``'s CPU counters (seconds), the
    1-minute load average, this process's and its reaped children's CPU seconds, and every
    other process's CPU seconds by ``(pid, start time)`` with its name."""

    wall: float
    busy: float  # all cores: user + nice + system + irq + softirq (seconds)
    steal: float
    total: float  # all CPU time, idle and steal included
    load: float
    ours: float  # os.times(): this process + reaped children, user + system
    procs: Dict[Tuple[int, int], Tuple[str, float]] = field(default_factory=dict)
    cores: int = 1


def _cpu_counters(stat: str) -> Tuple[float, float, float]:
    """``(busy, steal, total)`` seconds from the ``cpu`` line of ``/proc/stat``."""
    values = [int(v) for v in stat.split("\n", 1)[0].split()[1:]]
    values += [0] * (8 - len(values))
    user, nice, system, idle, iowait, irq, softirq, steal = values[:8]
    busy = user + nice + system + irq + softirq
    return busy / TICK, steal / TICK, (busy + idle + iowait + steal) / TICK


def _processes(exclude: int) -> Dict[Tuple[int, int], Tuple[str, float]]:
    """CPU seconds (user + system) of every process but ``exclude``, by (pid, start time)."""
    out = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == exclude:
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # gone, or not ours to read
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        out[int(entry.name), int(fields[19])] = (name, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def snapshot() -> Snapshot:
    """The machine now (Linux ``/proc``; elsewhere a snapshot with zero counters)."""
    t = os.times()
    ours = t.user + t.system + t.children_user + t.children_system
    try:
        stat = (PROC / "stat").read_text()
        busy, steal, total = _cpu_counters(stat)
        # the cores /proc/stat counts (in a container: maybe more than ours to use)
        cores = sum(1 for line in stat.splitlines() if line[:3] == "cpu" and line[3:4].isdigit())
        load = float((PROC / "loadavg").read_text().split()[0])
        procs = _processes(os.getpid())
    except (OSError, ValueError, IndexError):
        busy = steal = total = load = 0.0
        procs, cores = {}, os.cpu_count() or 1
    return Snapshot(time.monotonic(), busy, steal, total, load, ours, procs, max(cores, 1))


@dataclass(frozen=True)
class Verdict:
    """What the machine did between two snapshots, and whether that counts as busy."""

    seconds: float
    others: float  # fraction of all cores used by processes not ours
    steal: float  # fraction of all CPU time stolen
    load: Tuple[float, float]  # 1-minute load average before, after
    busy_processes: List[Tuple[int, str, float]]  # (pid, name, share of one core)
    cores: int

    @property
    def busy(self) -> bool:
        return (self.others > OTHERS_MAX or self.steal > STEAL_MAX
                or bool(self.busy_processes))

    def reasons(self) -> str:
        """``others 48% of 2 cores, steal 0%, 1 busy process (4242 python 97%)``."""
        text = f"others {self.others:.0%} of {self.cores} cores, steal {self.steal:.0%}"
        if self.busy_processes:
            shown = ", ".join(f"{pid} {name} {share:.0%}"
                              for pid, name, share in self.busy_processes[:3])
            more = len(self.busy_processes) - 3
            text += (f", {len(self.busy_processes)} busy process"
                     f"{'es' if len(self.busy_processes) > 1 else ''} ({shown}"
                     f"{f' +{more}' if more > 0 else ''})")
        return text

    def cell(self) -> str:
        """The row's ``Machine`` cell: ``busy (...)`` or ``quiet (...)``, with the load."""
        word = "busy" if self.busy else "quiet"
        return f"{word} ({self.reasons()}; load {self.load[0]:.1f}->{self.load[1]:.1f})"

    def record(self) -> dict:
        """The numbers, for the JSON twin's ``extra["machine"]``."""
        return {"busy": self.busy, "seconds": round(self.seconds, 1),
                "others": round(self.others, 3), "steal": round(self.steal, 3),
                "load_before": self.load[0], "load_after": self.load[1], "cores": self.cores,
                "busy_processes": [{"pid": p, "name": n, "share": round(s, 2)}
                                   for p, n, s in self.busy_processes]}


def judge(before: Snapshot, after: Snapshot) -> Verdict:
    """The :class:`Verdict` over the interval between two snapshots of this process."""
    wall = max(after.wall - before.wall, 1e-6)
    cores = max(after.cores, 1)
    others_cpu = (after.busy - before.busy) - (after.ours - before.ours)
    total = after.total - before.total  # all CPU time of the interval, idle and steal included
    others = min(max(others_cpu / (total if total > 0 else wall * cores), 0.0), 1.0)
    steal = (after.steal - before.steal) / total if total > 0 else 0.0
    busy = []
    for key, (name, cpu) in after.procs.items():
        used = cpu - before.procs[key][1] if key in before.procs else cpu
        if used / wall >= BUSY_PROCESS:
            busy.append((key[0], name, used / wall))
    busy.sort(key=lambda item: -item[2])
    return Verdict(wall, others, max(steal, 0.0), (before.load, after.load), busy, cores)


class Watch:
    """``with Watch() as watch: <run>`` then ``watch.verdict``: the machine over the run."""

    verdict: Optional[Verdict] = None

    def __enter__(self) -> "Watch":
        self._before = snapshot()
        return self

    def __exit__(self, *exc) -> None:
        self.verdict = judge(self._before, snapshot())


def probe(seconds: float = 3.0, sleep: Callable[[float], None] = time.sleep) -> Verdict:
    """The machine over ``seconds`` while this process waits (nothing of ours runs)."""
    before = snapshot()
    sleep(seconds)
    return judge(before, snapshot())


def wait_until_quiet(limit: float, log: Callable[[str], None],
                     check: Callable[[], Verdict] = probe,
                     sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic) -> Verdict:
    """Probe until the machine is quiet; wait at most ``limit`` seconds (probing every 10 s).

    Raises:
        MachineBusy: still busy after ``limit`` seconds (``limit`` 0: at the first probe).
    """
    start = clock()
    verdict = check()
    while verdict.busy:
        waited = clock() - start
        if waited >= limit:
            raise MachineBusy(
                f"the machine is busy ({verdict.reasons()}) and --require-quiet "
                f"waited {waited:.0f} s of --quiet-wait {limit:g} s",
                hint="stop the other work and run again, raise --quiet-wait, or drop "
                     "--require-quiet (rounds measured while busy are flagged in the Machine "
                     "column)")
        log(f"the machine is busy ({verdict.reasons()}); waiting for it (--require-quiet, "
            f"{limit - waited:.0f} s left)")
        sleep(min(10.0, max(limit - waited, 0.0)))
        verdict = check()
    return verdict


def record_verdict(results: Path, start: Mark, verdict: Optional[Verdict]) -> str:
    """Write ``verdict`` into the rows appended to ``results`` since ``start`` (the ``Machine``
    cell, and ``extra["machine"]`` in the twin); returns the note for the progress line
    (``""`` when the machine was quiet or not watched)."""
    if verdict is None:
        return ""
    annotate_since(results, start, "Machine", verdict.cell(), "machine", verdict.record())
    return f"measured while the machine was busy ({verdict.reasons()})" if verdict.busy else ""
