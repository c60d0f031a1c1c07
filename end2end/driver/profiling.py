"""Profile one training step of a benchmark run, and compare runs op by op.

``python -m end2end.bench ... --profile DIR`` runs one extra step after the timed ones (never
inside them) under ``torch.profiler`` on every rank and writes, per rank,
``DIR/<run>.rank<R>.json`` (self time per op, microseconds: CPU, and CUDA when on a GPU) and
``DIR/<run>.rank<R>.txt`` (torch's table of the top ops). To see where two systems differ::

    python -m end2end.profiling DIR/megatron-*.rank0.json DIR/slapo-megatron-*.rank0.json

prints the ops that take the most time in any of the files, side by side, with totals — the
numbers behind "where the baseline stays ahead" in ``end2end/README.md``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from slapo.errors import ConfigError

__all__ = ["profile_step", "load_profile", "compare_profiles", "main"]


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", label).strip("_")


def profile_step(step: Callable[[], Any], out_dir: str, label: str, rank: int,
                 on_cuda: bool = False, top: int = 40) -> Path:
    """Run ``step()`` once under the profiler; write the rank's JSON and table; return the
    JSON's path."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        step()
        if on_cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    ops = {e.key: {"cpu_us": e.self_cpu_time_total, "count": e.count,
                   **({"cuda_us": getattr(e, "self_device_time_total", 0)} if on_cuda else {})}
           for e in events}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{_safe(label)}.rank{rank}"
    path = out / f"{stem}.json"
    path.write_text(json.dumps({"run": label, "rank": rank, "ops": ops}, indent=1))
    sort = "self_cuda_time_total" if on_cuda else "self_cpu_time_total"
    (out / f"{stem}.txt").write_text(events.table(sort_by=sort, row_limit=top))
    return path


def load_profile(path: str) -> Dict[str, Any]:
    """A profile JSON written by :func:`profile_step` (clear error otherwise)."""
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data["ops"], dict):
            raise TypeError("'ops' is not a table")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a profile written by end2end.bench --profile ({exc})",
                          hint="pass the .json files of DIR (python -m end2end.bench ... "
                               "--profile DIR)") from exc
    return data


def compare_profiles(paths: Sequence[str], top: int = 25, key: str = "cpu_us") -> str:
    """A text table: the ``top`` ops by the largest self time in any profile, in ms, one column
    per profile, and the totals."""
    profiles = [load_profile(p) for p in paths]
    names = sorted({op for prof in profiles for op in prof["ops"]},
                   key=lambda op: -max(p["ops"].get(op, {}).get(key, 0) for p in profiles))
    width = min(30, max(12, *(len(Path(p).stem) for p in paths)))
    head = f"{'op (self time, ms)':48s}" + "".join(f" {Path(p).stem[:width]:>{width}s}"
                                                   for p in paths)
    lines = [head]
    for op in names[:top]:
        lines.append(f"{op[:48]:48s}" + "".join(
            f" {p['ops'].get(op, {}).get(key, 0) / 1e3:>{width}.1f}" for p in profiles))
    lines.append(f"{'total':48s}" + "".join(
        f" {sum(o.get(key, 0) for o in p['ops'].values()) / 1e3:>{width}.1f}"
        for p in profiles))
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    from end2end.cli import HelpFormatter, number, report_errors

    p = argparse.ArgumentParser(prog="python -m end2end.profiling", formatter_class=HelpFormatter,
                                description="Compare per-op self times of profiled runs "
                                            "(end2end.bench --profile DIR), side by side.")
    p.add_argument("profiles", nargs="+", help="DIR/<run>.rank<R>.json files")
    p.add_argument("--top", type=number(int, minimum=1), default=25, help="ops shown")
    p.add_argument("--cuda", action="store_true", help="CUDA self time instead of CPU")
    p.add_argument("--debug", action="store_true", help="full traceback of an error")
    args = p.parse_args(argv)

    def run() -> int:
        print(compare_profiles(args.profiles, args.top, "cuda_us" if args.cuda else "cpu_us"))
        return 0

    return report_errors("end2end.profiling", run, args.debug)


if __name__ == "__main__":
    sys.exit(main())
