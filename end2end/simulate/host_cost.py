"""``python -m end2end.simulate.host_cost MEASURED [MEASURED ...] --calibrate-on WORD``: the host's
cost per op of eager PyTorch, measured on a GPU machine, and what it changes in the predictions.

A GPU profile's ``host_op_s`` (the host's time to issue one op: Python, dispatch, autograd,
launch) is a floor on each phase (:func:`end2end.simulate.cost.gpu_model.phase_seconds`). Its
datasheet value is a published range of the launch alone. This measures it instead: on runs that
leave the GPU waiting for the host (small models: the GPU idle over 90 % of the step, see
``end2end.simulate.gpu_busy``), the measured step divided by the ops the simulator records for
the same run is the host's time per recorded op. The *calibration* rows are those whose label
contains ``WORD`` (``--calibrate-on``); their median is the measured ``host_op_s``. Every other
row is *judged*: its step predicted with the profile's ``host_op_s`` and with the measured one,
beside the measured step, so the constant is taken from runs that do not judge it.

One rank only (``nGPU`` 1; the collectives of several ranks are not part of this), ``ok`` rows of
measured results files (their ``.jsonl`` twins: the median of a run's timed steps). Each run is
simulated in a process of its own (a few seconds each).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from slapo.errors import ConfigError

__all__ = ["recorded_ops", "host_cost", "format_host_cost", "main"]


def recorded_ops(row: Dict, profile) -> List:
    """The simulator's op records of rank 0 of a measured row's run on ``profile``."""
    from end2end.simulate.engine.step import simulate_rank_isolated
    from end2end.spec.config_file import make_run_spec
    from end2end.spec.layout import run_layout

    spec = make_run_spec(row["Impl"], row["Model"], int(row["nGPU"]), int(row["Seq"]),
                         int(row["DecSeq"]), int(row["Batch"]), str(row["Ckpt"]),
                         source=f"row {row['Impl']} {row['Model']}", dtype=row.get("Dtype"),
                         knobs=row.get("Knobs") or None)
    return simulate_rank_isolated(spec, run_layout(spec), 0,
                                  gpu=profile.compute_capability).ops


def _issued(ops) -> float:
    """Ops the host issues (views and runtime costs measured on a CPU are not)."""
    from end2end.simulate.cost.cpu_model import RUNTIME_COSTS

    return sum(op.weight for op in ops if not op.view and op.name not in RUNTIME_COSTS)


def _step(ops, profile) -> float:
    from end2end.simulate.cost.gpu_model import phase_seconds

    return sum(phase_seconds(ops, profile).values())


def _label(row: Dict) -> str:
    return (f"{row['Impl']} {row['Model']} n={row['nGPU']} s={row['Seq']} b={row['Batch']} "
            f"ckpt={row['Ckpt']}")


def host_cost(rows: Sequence[Dict], calibrate_on: str, profile,
              only: Sequence[str] = ()) -> Dict:
    """``host_op_s`` (the calibration rows' median), ``calibration`` (per row: label, measured
    step, issued ops, seconds per op) and ``judged`` (per row whose label has every word of
    ``only``: measured step, predicted with the profile's and with the measured host cost)."""
    ok = [r for r in rows if r.get("Status") == "ok"]
    several = [_label(r) for r in ok if int(r["nGPU"]) != 1]
    if several:
        raise ConfigError(f"{several[0]}: {len(several)} row(s) of several ranks",
                          hint="host_cost measures one rank's host; pass one-GPU runs")
    calib = [r for r in ok if calibrate_on in _label(r)]
    if not calib:
        raise ConfigError(f"no ok row's label contains {calibrate_on!r}",
                          hint="--calibrate-on a word of the host-bound runs' labels "
                               "(e.g. cpu/ for the small models)")
    judged = [r for r in ok if r not in calib and all(w in _label(r) for w in only)]
    calibration = []
    for row in calib:
        step = statistics.median(row["extra"]["step_times"])
        issued = _issued(recorded_ops(row, profile))
        calibration.append(dict(label=_label(row), step=step, ops=issued, per_op=step / issued))
    measured = statistics.median(c["per_op"] for c in calibration)
    with_host = dataclasses.replace(profile, host_op_s=measured)
    out = []
    for row in judged:
        ops = recorded_ops(row, profile)
        out.append(dict(label=_label(row), step=statistics.median(row["extra"]["step_times"]),
                        ops=_issued(ops), profile_step=_step(ops, profile),
                        measured_host_step=_step(ops, with_host)))
    return dict(host_op_s=measured, profile_host_op_s=profile.host_op_s,
                calibration=calibration, judged=out)


def _mape(rows: List[Dict], key: str) -> float:
    return statistics.mean(abs(r[key] / r["step"] - 1) for r in rows)


def format_host_cost(result: Dict, profile_name: str) -> str:
    """The calibration, the measured ``host_op_s`` and the judged rows as text."""
    us = result["host_op_s"] * 1e6
    per_op = [c["per_op"] * 1e6 for c in result["calibration"]]
    lines = ["calibration (host-bound runs): measured step / ops the simulator records"]
    for c in result["calibration"]:
        lines.append(f"  {c['label']:<55s} {c['step'] * 1e3:8.2f} ms  {c['ops']:7.0f} ops  "
                     f"{c['per_op'] * 1e6:6.1f} us/op")
    lines.append(f"host_op_s measured: {us:.1f} us (median of {len(per_op)}, "
                 f"{min(per_op):.1f}-{max(per_op):.1f}); {profile_name}'s: "
                 f"{result['profile_host_op_s'] * 1e6:.1f} us")
    judged = result["judged"]
    if judged:
        lines.append(f"judged runs: step ms measured, predicted for {profile_name} with its "
                     f"host cost and with the measured one (predictions, not measurements)")
        for r in judged:
            lines.append(f"  {r['label']:<55s} {r['step'] * 1e3:8.1f}  "
                         f"{r['profile_step'] * 1e3:8.1f} ({r['step'] / r['profile_step']:.2f})  "
                         f"{r['measured_host_step'] * 1e3:8.1f} "
                         f"({r['step'] / r['measured_host_step']:.2f})")
        lines.append(f"mean absolute error of the predicted step: "
                     f"{_mape(judged, 'profile_step'):.0%} with the profile's host cost, "
                     f"{_mape(judged, 'measured_host_step'):.0%} with the measured one")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    from end2end.cli import HelpFormatter
    from end2end.simulate.cost.profiles import PROFILES

    p = argparse.ArgumentParser(prog="python -m end2end.simulate.host_cost",
                                formatter_class=HelpFormatter, description=__doc__)
    p.add_argument("measured", nargs="+", help="results TSVs of measured one-GPU runs")
    p.add_argument("--calibrate-on", required=True, metavar="WORD",
                   help="rows whose label contains WORD calibrate; the others are judged")
    p.add_argument("--device", default="h200", choices=tuple(PROFILES),
                   help="the GPU profile the runs were measured on")
    p.add_argument("--only", action="append", default=[], metavar="WORD",
                   help="judge only rows whose label contains WORD (repeatable)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print the calibration and the judged rows; 1 with the reason on bad input."""
    from end2end.simulate.cost.profiles import get_profile
    from end2end.simulate.gpu_busy import jsonl_rows

    args = build_parser().parse_args(argv)
    profile = get_profile(args.device)
    try:
        rows = [row for path in args.measured for row in jsonl_rows(Path(path))]
        result = host_cost(rows, args.calibrate_on, profile, args.only)
    except ConfigError as exc:
        print(f"end2end.simulate.host_cost: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(format_host_cost(result, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
