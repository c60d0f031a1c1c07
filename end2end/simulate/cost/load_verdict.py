"""What a ``cpu`` calibration's recorded load means (measured by
:mod:`end2end.simulate.calibration.load`, whose docstring says what each number is): whether the
machine was quiet enough, and a short text for rows and logs. Thresholds stated once here."""

from __future__ import annotations

from typing import Dict, Optional, Sequence

__all__ = ["verdict", "describe_load", "spread", "MAX_BUSY", "MAX_STEAL", "MAX_LOAD_PER_CORE",
           "MAX_SPREAD"]

MAX_BUSY = 0.10  # share of the CPU time others used while sampling (as end2end/sweep/quiet.py)
MAX_STEAL = 0.05  # share the hypervisor stole
MAX_LOAD_PER_CORE = 0.5  # 1-minute load average per usable core
MAX_SPREAD = 0.15  # relative spread of repeated measurements


def spread(values: Sequence[float]) -> float:
    """``(max - min) / max`` of repeated measurements (0 for fewer than two)."""
    values = [float(v) for v in values]
    if len(values) < 2 or max(values) <= 0:
        return 0.0
    return (max(values) - min(values)) / max(values)


def verdict(load: Dict[str, float]) -> str:
    """"" when ``load`` (:func:`machine_load`, optionally with ``spread``) is quiet, else one
    line saying what is not."""
    reasons = []
    if load.get("busy", 0.0) > MAX_BUSY:
        reasons.append(f"{load['busy']:.0%} of the CPU busy with other work")
    if load.get("steal", 0.0) > MAX_STEAL:
        reasons.append(f"{load['steal']:.0%} stolen by the hypervisor")
    if load.get("loadavg", 0.0) > MAX_LOAD_PER_CORE * load.get("cores", 1):
        reasons.append(f"load average {load['loadavg']:g} on {load.get('cores', 1):g} cores")
    if load.get("spread", 0.0) > MAX_SPREAD:
        reasons.append(f"repeated measurements {load['spread']:.0%} apart")
    return "; ".join(reasons)


def describe_load(load: Optional[Dict[str, float]]) -> str:
    """A short text of a recorded load, for rows and logs ("load not recorded" for files
    measured before it was)."""
    if not load:
        return "load not recorded"
    parts = [f"load {load.get('loadavg', 0):g}/{load.get('cores', 1):g} cores"]
    if "busy" in load:
        parts.append(f"busy {load['busy']:.0%}, steal {load.get('steal', 0):.0%}")
    if "spread" in load:
        parts.append(f"GEMM repeats {load['spread']:.0%} apart")
    bad = verdict(load)
    return ", ".join(parts) + (f" (busy: {bad})" if bad else " (quiet)")
