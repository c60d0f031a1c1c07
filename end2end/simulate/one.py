"""``python -m end2end.simulate.one --mode M --model X --gpus N --seq-len S --batch-size B --ckpt C
--device PROFILE [--mem-budget-gb G] [--calibration FILE]``: simulate ONE run and print its
prediction as one JSON line, the line ``slapo.autotune``'s ``predict`` command prints::

    {"status": "sim", "memory_gb": 1.21, "samples_per_s": 3.4, "error": "", ...}

The run is validated as the driver validates it (``make_run_spec``: the same errors as
``autotune.driver`` and a config line) before any profile is read or measured (this command
never calibrates: ``--device cpu`` needs a calibration file), and simulated in a worker process
of its own
(:func:`end2end.simulate.engine.run.simulate_run`), so no fake world lives in this process.
``memory_gb`` is the predicted ``PerGPUMem`` (peak per rank, comparable with what the driver
measures: on ``cpu`` the profile's calibrated RSS overhead included), ``samples_per_s`` the
predicted throughput, ``calibration`` which calibration (file, date, load) or datasheet
profile the prediction used, ``timing`` the slowest rank's seconds by phase (compute, exposed
and hidden communication, total: the row's ``extra.timing``). ``status``: ``sim``; ``sim-oom``
when ``memory_gb`` exceeds ``--mem-budget-gb`` (the budget the driver's ``--mem-budget-gb``
enforces for real), or, without a budget, when the profile predicts the device's memory is
exceeded; ``fail`` with the error a real run would raise (an invalid run prints ``fail``
too); ``timeout`` after ``--timeout``. Usage mistakes (an unknown profile, a calibration file
that does not exist) are one line on stderr and exit status 2, so the tuner reports the
template as wrong instead of guessing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from slapo.errors import ConfigError

__all__ = ["main", "predict_one", "prediction_line"]


def build_parser() -> argparse.ArgumentParser:
    from end2end.cli import HelpFormatter, add_workload_arguments, number

    p = argparse.ArgumentParser(prog="python -m end2end.simulate.one",
                                formatter_class=HelpFormatter,
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", required=True, help="a mode of end2end/spec/modes.py")
    p.add_argument("--gpus", type=number(int, minimum=1), required=True,
                   help="ranks (GPUs) of the run")
    add_workload_arguments(p)
    p.add_argument("--ckpt", required=True, help="CKPT as in a config line")
    p.add_argument("--device", required=True, help="the device profile (docs/simulate.md)")
    p.add_argument("--mem-budget-gb", type=number(float, above=0), default=None,
                   help="memory per rank a run may use: above it the prediction is sim-oom")
    p.add_argument("--calibration", default="", help="--device cpu: the profile's measurement "
                   "file (default: ~/.cache/slapo/cpu_profile.json)")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE")
    for name in ("--tp", "--pp", "--micro-batch-size"):
        p.add_argument(name, type=int, default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--fp32-masters", action="store_true", default=None,
                   help="fp32 master weights in the plain-PyTorch modes (end2end.bench's)")
    p.add_argument("--timeout", type=number(float, above=0), default=600,
                   help="seconds before the simulation is stopped (a timeout prediction)")
    return p


def prediction_line(values: Dict[str, Any], budget_gb: Optional[float]) -> Dict[str, Any]:
    """The JSON line of a simulated row's fields
    (:func:`end2end.simulate.engine.run.simulate_run`)."""
    status, error = values.get("status", "fail"), values.get("error", "")
    out: Dict[str, Any] = {"status": status, "error": error}
    if status in ("sim", "sim-oom"):
        memory = float(values["per_gpu_mem"])
        if budget_gb is not None:
            status = "sim-oom" if memory > budget_gb else "sim"
            error = (f"predicted {memory:.3g} GB per rank > budget {budget_gb:g} GB"
                     if status == "sim-oom" else "")
        out.update(status=status, error=error, memory_gb=memory,
                   samples_per_s=float(values["thrpt"]), step_time=values.get("step_time"),
                   needed_gb=round(values.get("extra", {}).get("needed_bytes", 0) / 1e9, 4))
        timing = values.get("extra", {}).get("timing") or []
        if timing:  # the slowest role's seconds by phase (what the step is made of)
            slow = max(timing, key=lambda t: t.get("total", 0.0))
            out["timing"] = {k: round(v, 6) for k, v in slow.items()
                             if isinstance(v, (int, float))}
    elif status not in ("fail", "timeout"):  # e.g. an OOM raised while building
        out.update(status="fail", error=f"{status}: {error}")
    return out


def predict_one(args: argparse.Namespace) -> Dict[str, Any]:
    """Validate and simulate the run of ``args``; its prediction line."""
    from end2end.simulate.cost.profiles import get_profile
    from end2end.simulate.engine.run import simulate_run
    from end2end.spec.config_file import make_run_spec
    from end2end.spec.knobs import format_knobs

    from slapo.errors import SlapoError

    if args.calibration and not Path(args.calibration).is_file():
        raise ConfigError(f"--calibration {args.calibration}: no such file",
                          call="end2end.simulate.one",
                          hint="give the cpu profile's measurement (e.g. docs/results/"
                          "cpu_profile.json) or measure one: python -m end2end.simulate."
                          f"calibrate --out {args.calibration}")
    try:  # the run first: an invalid one is answered before any profile is read
        spec = make_run_spec(args.mode, args.model, args.gpus, args.seq_len, args.dec_seq_len,
                             args.batch_size, args.ckpt, source="end2end.simulate.one",
                             dtype=args.dtype, tp=args.tp, pp=args.pp,
                             micro_batch=args.micro_batch_size,
                             knobs=format_knobs(args.knob) or None,
                             fp32_masters=args.fp32_masters)
    except SlapoError as exc:
        return {"status": "fail", "error": f"invalid run: {' '.join(str(exc).split())}"}
    profile = get_profile(args.device, args.calibration or None)  # an unknown name: ConfigError
    began = time.perf_counter()
    values = simulate_run(spec, profile.name, args.calibration, args.timeout)
    out = prediction_line(values, args.mem_budget_gb)
    out.update(seconds=round(time.perf_counter() - began, 2), device=profile.label,
               calibration=profile.provenance)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    from end2end.cli import report_errors

    args = build_parser().parse_args(argv)

    def run() -> int:
        print(json.dumps(predict_one(args)), flush=True)
        return 0

    return report_errors("end2end.simulate.one", run, debug=False)


if __name__ == "__main__":
    sys.exit(main())
