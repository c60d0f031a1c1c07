"""Is this machine quiet enough to calibrate the ``cpu`` profile on? (issue 35)

A calibration measured beside other jobs is wrong without a word (one read the 2-thread
elementwise bandwidth as 7e7 B/s instead of 1.8e11, and the gloo latency 9x too high), and it
was then used for every later prediction. So the calibration looks at the machine first:

* ``loadavg``: the 1-minute load average (``os.getloadavg``) against the cores this process may
  use (``os.sched_getaffinity``);
* ``busy``, ``steal``: over a short sample of ``/proc/stat``, the share of CPU time the machine
  spent on work (not idle or waiting for I/O) and the share the hypervisor stole for other
  guests (Linux's ``steal`` column);
* ``spread``: where the calibration repeats a measurement (its 1024^3 GEMM, three windows), the
  relative spread of the repeats, ``(max - min) / max``.

:func:`~end2end.simulate.cost.load_verdict.verdict` (in the cost layer, which reads recorded
loads) says whether that is quiet (busy <= ``MAX_BUSY``, steal <= ``MAX_STEAL``, load average
<= ``MAX_LOAD_PER_CORE`` per core, spread <= ``MAX_SPREAD``) and, if not, why, in one line.
A calibration never taken explicitly (the
cache missing) is refused on a busy machine; one asked for (``--calibrate``,
``python -m end2end.simulate.calibrate``) is measured with a one-line warning; either way the
file records the load (``load``), and every prediction made with it says which calibration,
measured when and under what load (:func:`describe_load`).
"""

from __future__ import annotations

import os
import time
from typing import Dict, List, Optional

from end2end.simulate.cost.load_verdict import (MAX_BUSY, MAX_LOAD_PER_CORE, MAX_SPREAD,
                                                MAX_STEAL, describe_load, spread, verdict)

__all__ = ["machine_load", "verdict", "describe_load", "spread", "MAX_BUSY", "MAX_STEAL",
           "MAX_LOAD_PER_CORE", "MAX_SPREAD"]

def _cpu_times(stat: str = "/proc/stat") -> Optional[List[int]]:
    """The machine's aggregate CPU times (user nice system idle iowait irq softirq steal ...),
    or None where there is no /proc/stat."""
    try:
        with open(stat) as f:
            fields = f.readline().split()
    except OSError:
        return None
    return [int(x) for x in fields[1:]] if fields and fields[0] == "cpu" else None


def machine_load(sample_s: float = 0.5, stat: str = "/proc/stat") -> Dict[str, float]:
    """``loadavg``, ``cores``, ``busy``, ``steal`` of this machine now (module docstring)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    out: Dict[str, float] = dict(loadavg=round(os.getloadavg()[0], 2), cores=cores,
                                 measured=time.time())
    first = _cpu_times(stat)
    time.sleep(sample_s)
    second = _cpu_times(stat)
    if first and second:
        delta = [b - a for a, b in zip(first, second)]
        total = max(sum(delta[:8]), 1)
        idle = delta[3] + (delta[4] if len(delta) > 4 else 0)
        out.update(busy=round(1 - idle / total, 3),
                   steal=round(delta[7] / total if len(delta) > 7 else 0.0, 3))
    return out
