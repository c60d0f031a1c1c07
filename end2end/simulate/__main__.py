"""``python -m end2end.simulate CONFIG --device PROFILE [--results FILE] [--only WORD ...]
[--jobs N]``: simulate every run of a config at its real size (docs/simulate.md), ``N`` at a
time, and write one row per run (``Status`` ``sim``/``sim-oom``, or ``fail`` as a real run
would; ``Device`` e.g. ``v100-32gb (simulated)``), in the config's order, to a results file of
simulated rows only."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from slapo.errors import ConfigError

__all__ = ["main", "build_parser", "select_runs", "SIMULATED_STATUSES"]

SIMULATED_STATUSES = ("sim", "sim-oom")


def build_parser() -> argparse.ArgumentParser:
    from end2end.cli import HelpFormatter, number
    from end2end.simulate.cost.profiles import PROFILES

    p = argparse.ArgumentParser(prog="python -m end2end.simulate",
                                formatter_class=HelpFormatter, description=__doc__)
    p.add_argument("config", help="a benchmark config (end2end/configs/*.cfg)")
    p.add_argument("--device", required=True, choices=tuple(PROFILES) + ("cpu",),
                   help="the device profile to predict for (docs/simulate.md)")
    p.add_argument("--results", default=None, help="results TSV for the simulated rows "
                   "(default: results/<config>.<device>.sim.tsv); resumed when it exists")
    p.add_argument("--only", action="append", default=[], metavar="WORD",
                   help="simulate only runs whose label (mode model n=N ...) contains WORD "
                        "(repeatable: all must match)")
    p.add_argument("--max-devices", type=int, default=64,
                   help="the largest GPU count for 'pow2' lines")
    p.add_argument("--calibrate", action="store_true",
                   help="--device cpu: re-measure this machine (else the cached measurement; "
                        "a missing one is measured only on a quiet machine)")
    p.add_argument("--calibration", default="", help="the cpu profile's cache file "
                   "(default: ~/.cache/slapo/cpu_profile.json)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--jobs", type=number(int, minimum=1), default=2,
                   help="runs simulated at a time, one process each (a simulation keeps one "
                        "core busy; rows are written in the config's order)")
    return p


def select_runs(config: str, only: Sequence[str], max_devices: int) -> List:
    """The config's runs whose label contains every word of ``only``."""
    from end2end.spec.config_file import load_runs

    return [s for s in load_runs(config, max_devices=max_devices)
            if all(w in f"{s.label} n={s.n}" for w in only)]


def _check_results_file(path: Path):
    """The rows already simulated in ``path``; refuse a file holding measured rows."""
    from end2end.results.store import read_results

    if not path.exists():
        return []
    res = read_results(path)
    measured = [r for r in res.rows if "(simulated)" not in r.device]
    if measured:
        raise ConfigError(f"{path} holds {len(measured)} measured row(s)", call="end2end.simulate",
                          hint="write simulated rows to a file of their own (--results)")
    return res.rows


def run(args: argparse.Namespace) -> int:
    from end2end.cli import get_logger
    from end2end.results.environment import env_dump
    from end2end.results.store import ResultRow, append_result, env_columns
    from end2end.simulate.calibration.cpu import device_profile
    from end2end.simulate.engine.run import simulate_runs

    log = get_logger("end2end.simulate")
    profile = device_profile(args.device, args.calibration or None, args.calibrate)
    out = Path(args.results or f"results/{Path(args.config).stem}.{args.device}.sim.tsv")
    done = {r.key for r in _check_results_file(out)}
    runs = [s for s in select_runs(args.config, args.only, args.max_devices) if s.key not in done]
    env = dict(env_dump("cpu"), device=profile.label, simulated=True,
               profile=profile.description, calibration=profile.provenance)
    log.info("%s: %d runs to simulate for %s -> %s", args.config, len(runs), profile.label, out)
    log.info("predicting with the %s (%d at a time)", profile.provenance, args.jobs)
    began_all = time.perf_counter()
    simulated = simulate_runs(runs, profile.name, args.calibration, args.timeout, args.jobs)
    for i, (spec, values, seconds) in enumerate(simulated, 1):
        values.setdefault("extra", {})["wall_s"] = round(seconds, 2)
        row = ResultRow.from_spec(spec, time=time.strftime("%Y-%m-%dT%H:%M:%S"),
                                  **{**env_columns(env), "device": profile.label}, **values)
        append_result(out, row, env)
        log.info("[%d/%d] %s: %s %s (%.0f s)", i, len(runs), spec.label, row.status,
                 f"{row.thrpt:.3g} samples/s, {row.per_gpu_mem:.1f} GB/rank" if row.thrpt
                 else row.error[:200], seconds)
    log.info("%d runs simulated in %.0f s", len(runs), time.perf_counter() - began_all)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    from end2end.cli import configure_logging, report_errors

    args = build_parser().parse_args(argv)
    configure_logging()
    return report_errors("end2end.simulate", lambda: run(args), debug=False)


if __name__ == "__main__":
    sys.exit(main())
