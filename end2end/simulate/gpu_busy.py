"""``python -m end2end.simulate.gpu_busy MEASURED SIMULATED --profiles DIR``: where a measured GPU
step's time goes, beside the simulator's prediction of it.

A GPU run of the driver with ``--profile DIR`` (``scripts/gpu_check.sh`` does this) writes, per
run, the torch profiler's table of one more step: each op's and each kernel's GPU time. This
splits the measured step into the time the GPU was busy (the sum of the step's GPU activities:
kernels, copies and memsets) and the time it sat idle (the rest of the measured step time:
waiting for the host to issue work, or for a synchronisation), and sets both beside the
simulator's predicted step (``compute`` of its timing, per phase) for the same run. A prediction
close to the busy time but short of the step says the kernel model holds and the host/overlap
model does not; one far from both says the kernel model is off.

One line per measured run (matched to the simulated file's row of the same run: mode, model,
ranks, shape, batch, checkpointing, knobs); a run without a profile or prediction says so.
Both files are results TSVs (or their ``.jsonl`` twins, which hold the details read here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from slapo.errors import ConfigError

from end2end.simulate.compare import text_table

__all__ = ["gpu_busy_us", "jsonl_rows", "busy_rows", "format_busy", "main"]

_KEY = ("Impl", "Model", "Seq", "DecSeq", "nGPU", "Batch", "Ckpt", "TP", "PP", "Knobs")


def gpu_busy_us(profile: Dict) -> float:
    """The GPU time of a profiled step (microseconds): the entries of GPU activities (kernels,
    memcpy, memset) in a table written by :func:`end2end.driver.profiling.profile_step`. Those
    have GPU time and no CPU time of their own; a user annotation (``Optimizer.step#AdamW.step``,
    a range over kernels already counted) is not one."""
    return sum(entry.get("cuda_us", 0.0) for name, entry in profile["ops"].items()
               if entry.get("cuda_us", 0.0) > 0 and not entry.get("cpu_us", 0.0)
               and "#" not in name)


def jsonl_rows(path: Path) -> List[Dict]:
    """The measured or simulated rows of a results TSV's JSON-lines twin (clear error)."""
    twin = path.with_suffix(".jsonl")
    try:
        lines = twin.read_text().splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{twin}: cannot read the results' JSON-lines twin ({exc})",
                          hint="pass a results file written by end2end.sweep or "
                               "end2end.simulate (x.tsv with x.jsonl beside it)") from exc
    return [row for row in rows if row.get("type") == "row"]


def _key(row: Dict) -> Tuple:
    return tuple(str(row.get(k, "")) for k in _KEY)


def _predicted(row: Optional[Dict]) -> Optional[Dict[str, float]]:
    timing = ((row or {}).get("extra") or {}).get("timing") or []
    if not timing:
        return None
    rank = timing[0]
    return {phase: rank.get(f"compute_{phase}", 0.0) * 1e3
            for phase in ("forward", "backward", "optimizer")} | \
        {"step": rank.get("total", 0.0) * 1e3}


def busy_rows(measured: Path, simulated: Path, profiles: Path) -> List[Dict]:
    """Per measured ``ok`` run: ``label``, measured ``step_ms`` (median of its timed steps),
    ``busy_ms`` (the profiled step's GPU time, None without a profile), ``idle`` (1 - busy /
    step), ``predicted`` (step and per-phase milliseconds, None without a prediction)."""
    pred = {_key(row): row for row in jsonl_rows(simulated)
            if str(row.get("Status", "")).startswith("sim")}
    out = []
    for row in jsonl_rows(measured):
        if row.get("Status") != "ok":
            continue
        extra = row.get("extra") or {}
        steps = extra.get("step_times") or [float(row["StepTime"])]
        step_ms = statistics.median(steps) * 1e3
        busy_ms = None
        if extra.get("profile"):
            path = profiles / Path(extra["profile"]).name
            if path.is_file():
                busy_ms = gpu_busy_us(json.loads(path.read_text())) / 1e3
        label = (f"{row['Impl']} {row['Model']} n={row['nGPU']} s={row['Seq']} "
                 f"b={row['Batch']} ckpt={row['Ckpt']}")
        out.append(dict(label=label, step_ms=step_ms, busy_ms=busy_ms,
                        idle=None if busy_ms is None else 1 - busy_ms / step_ms,
                        predicted=_predicted(pred.get(_key(row)))))
    return out


def format_busy(rows: List[Dict]) -> str:
    """The lines as a text table."""
    head = ["run", "step ms (measured)", "GPU busy ms (profiled)", "idle",
            "predicted step ms (fwd/bwd/opt)", "busy/pred", "step/pred"]
    body = []
    for r in rows:
        p, busy = r["predicted"], r["busy_ms"]
        body.append([
            r["label"], f"{r['step_ms']:.1f}",
            "no profile" if busy is None else f"{busy:.1f}",
            "-" if r["idle"] is None else f"{r['idle']:.0%}",
            "no prediction" if p is None else
            f"{p['step']:.1f} ({p['forward']:.1f}/{p['backward']:.1f}/{p['optimizer']:.1f})",
            f"{busy / p['step']:.2f}" if p and busy else "-",
            f"{r['step_ms'] / p['step']:.2f}" if p else "-"])
    return text_table("measured GPU steps beside the simulator's predictions (not measurements)",
                      head, body)


def build_parser() -> argparse.ArgumentParser:
    from end2end.cli import HelpFormatter

    p = argparse.ArgumentParser(prog="python -m end2end.simulate.gpu_busy",
                                formatter_class=HelpFormatter, description=__doc__)
    p.add_argument("measured", help="results TSV of measured GPU runs made with --profile DIR")
    p.add_argument("simulated", help="results TSV of the simulator's rows of the same config")
    p.add_argument("--profiles", required=True, help="the runs' profile folder (DIR)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print the table; 1 with the reason when no measured run is found."""
    args = build_parser().parse_args(argv)
    try:
        rows = busy_rows(Path(args.measured), Path(args.simulated), Path(args.profiles))
    except ConfigError as exc:
        print(f"end2end.simulate.gpu_busy: {exc}", file=sys.stderr)
        return 1
    if not rows:
        print(f"end2end.simulate.gpu_busy: no ok row in {args.measured}", file=sys.stderr)
        return 1
    sys.stdout.write(format_busy(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
