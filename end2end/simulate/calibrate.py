"""``python -m end2end.simulate.calibrate [--out FILE] [--memory-only]``: measure this machine
for the simulator's ``cpu`` profile (:mod:`end2end.simulate.calibration.cpu` measures, and
documents every number of the file) and print it. A command-line tool of the simulator's top
layer; the path is the one docs/results/cpu_profile.cmd and the docs use.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional, Sequence

from slapo.errors import ConfigError

from end2end.simulate.calibration.cpu import cpu_profile, memory_calibration
from end2end.simulate.cost.profiles import DEFAULT_CACHE, FORMAT, profile_from_file

__all__ = ["main", "describe"]


def describe(profile) -> str:
    """A few lines that summarise a ``cpu`` profile (what the CLI prints)."""
    lines = [profile.description,
             "  GEMM 1024^3, all cores: " + ", ".join(
                 f"{d} {r / 1e9:.0f} GFLOP/s" for d, r in profile.flops.items()),
             f"  copy bandwidth {profile.memory_bandwidth / 1e9:.1f} GB/s; gloo all-reduce "
             f"alpha {profile.alpha_s * 1e6:.0f} us, {profile.intra_node_bandwidth / 1e9:.2f} "
             f"GB/s; RSS = {profile.measured_fixed_bytes / 1e9:.2f} GB + live bytes x "
             f"{1 + profile.measured_overhead:.2f}"]
    zero3 = profile.eager.runtime_seconds
    if zero3:
        lines.append("  ZeRO-3 per step (us) per module / parameter / MB: " + ", ".join(
            f"{phase} {zero3.get(f'zero3.module.{phase}', 0) * 1e6:.0f} / "
            f"{zero3.get(f'zero3.param.{phase}', 0) * 1e6:.0f} / "
            f"{zero3.get(f'zero3.byte.{phase}', 0) * 1e12:.0f}"
            for phase in ("forward", "backward", "optimizer")))
    for threads, m in sorted(profile.eager.per_threads.items()):
        mm = m.gemm["float32"]["mm"]
        lines.append(f"  {threads} thread(s): per op " + ", ".join(
            f"{k} {v * 1e6:.1f} us" for k, v in m.op_seconds.items()) + "; per view " +
            ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in m.view_seconds.items()))
        lines.append("    fp32 mm GFLOP/s: " + ", ".join(
            f"{f:.2g} FLOP {r / 1e9:.0f}" for f, r in mm.points))
        lines.append("    add GB/s: " + ", ".join(
            f"{b / 1e6:.2g} MB {r / 1e9:.0f}" for b, r in m.bandwidth.points))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m end2end.simulate.calibrate [--out FILE]``: measure this machine into FILE
    (default: the cache) and print the profile."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m end2end.simulate.calibrate",
                                description="Measure this machine for the simulator's cpu "
                                "profile (about 2.5 minutes; run it on a quiet machine).")
    p.add_argument("--out", default=str(DEFAULT_CACHE), help="the calibration file to write")
    p.add_argument("--memory-only", action="store_true",
                   help="re-measure only the memory relation (two reference runs; RSS does not "
                        "depend on the machine's load) in the existing FILE of --out, of this "
                        f"format or format {FORMAT - 1}, which then is of format {FORMAT}")
    args = p.parse_args(argv)
    if args.memory_only:
        return _remeasure_memory(Path(args.out))
    print(describe(cpu_profile(args.out, recalibrate=True)))
    return 0


def _remeasure_memory(path: Path) -> int:
    """``--memory-only``: the memory fields of ``path`` measured again (the rest kept)."""
    data = json.loads(path.read_text()) if path.exists() else {}
    if data.get("format") not in (FORMAT - 1, FORMAT):
        raise ConfigError(f"the cpu calibration {path} is missing or of format "
                          f"{data.get('format', 1)}", call="end2end.simulate.calibrate "
                          "--memory-only", hint=f"measure it whole: python -m "
                          f"end2end.simulate.calibrate --out {path}")
    data.update(memory_calibration(), format=FORMAT,
                memory_measured=time.strftime("%Y-%m-%d %H:%M"))
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(describe(profile_from_file(path)))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
