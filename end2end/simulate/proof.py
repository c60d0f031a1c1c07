"""``python -m end2end.simulate.proof CONFIG [--out DIR] [--repeat R | --measured FILE]
[--calibrate] [--calibration FILE] [--only WORD ...]``: the simulator proved on this CPU
(issue 25, item 5).

In one job: with ``--calibrate``, the ``cpu`` profile is measured first
(``python -m end2end.simulate.calibrate``: into ``--calibration FILE``, default
``DIR/cpu_profile.json``), before anything else runs; then the config's lines are measured for
real (``python -m end2end.sweep CONFIG --device cpu``: the driver, interleaved rounds; or, with
``--measured FILE``, taken from a results file measured earlier, e.g. the committed
``docs/results/cpu.tsv``, and nothing is measured) and simulated with the ``cpu`` profile
(``python -m end2end.simulate CONFIG --device cpu``, the calibration of ``--calibration FILE``,
e.g. the committed ``docs/results/cpu_proof/cpu_profile.json``, or the cache), then compared
per run (measured: the median over rounds):

* peak memory per rank (``PerGPUMem``) and samples/s, predicted vs measured, and the error
  ``predicted / measured - 1``;
* over the runs: the median error, the mean absolute percentage error (MAPE), the Spearman rank
  correlation of samples/s (ranks by pandas; Pearson's correlation of the ranks), the share of
  runs whose memory is within 25 %;
* each Slapo mode against its baselines (the table of modes) on the same model, ranks and shape:
  the measured and the predicted speedup, and whether they point the same way (a measured ratio
  within 0.9-1.1 is "within noise" and its direction is not judged); every pair's *bias*,
  ``predicted ratio / measured ratio - 1`` (above 0: the simulator favours the Slapo mode more
  than the measurement does), and their median over all pairs, the signed bias (issue 35).

Goals (the issues'): memory within 25 % on at least 80 % of runs; throughput rank correlation
at least 0.8 and MAPE at most 35 %; every pair outside the noise band in the right direction;
the median signed bias of all pairs within +-5 %. The report
(Markdown, with date, machine, commit and command) goes to ``DIR/proof.md`` and stdout; the
measured and simulated rows stay in ``DIR/measured.tsv`` (unless ``--measured``) and
``DIR/simulated.tsv`` (resumable; ``DIR/simulated.cmd``: the command, for the docs' provenance).
The same tables go into the docs through the report block ``proof MEASURED SIMULATED``
(:mod:`end2end.report.proof_table`).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from slapo.errors import ConfigError

__all__ = ["main", "compare", "compare_frames", "summarise", "pairs", "report", "tables",
           "goals_met", "signed_bias"]

KEY = ["Impl", "Model", "Seq", "DecSeq", "nGPU", "Batch", "Ckpt", "Knobs"]
GOALS = dict(memory_within=0.25, memory_share=0.8, spearman=0.8, mape=0.35, noise=(0.9, 1.1),
             bias=0.05)


def _frame(path: Path, statuses: Sequence[str]):
    """The rows of ``path`` with one of ``statuses``, as a pandas frame: the median over rounds
    of memory and samples/s, and samples/s of the slowest and fastest round (``thrpt_min``,
    ``thrpt_max``)."""
    import pandas as pd

    from end2end.results.store import read_results

    rows = [r for r in read_results(path).rows if r.status in statuses]
    frame = pd.DataFrame([dict(Impl=r.impl, Model=r.model, Seq=r.seq, DecSeq=r.dec_seq,
                               nGPU=r.ngpu, Batch=r.batch, Ckpt=r.ckpt, Knobs=r.knobs or "",
                               mem=r.per_gpu_mem, thrpt=r.thrpt) for r in rows],
                         columns=KEY + ["mem", "thrpt"])
    return frame.groupby(KEY, as_index=False).agg(
        mem=("mem", "median"), thrpt=("thrpt", "median"), thrpt_min=("thrpt", "min"),
        thrpt_max=("thrpt", "max"))


def compare(measured: Path, simulated: Path):
    """One frame per run with both a measured (``ok``) and a simulated (``sim``/``sim-oom``)
    row: ``mem_measured mem_predicted mem_error thrpt_measured thrpt_predicted thrpt_error``,
    the measured rounds' range ``thrpt_min_measured thrpt_max_measured`` and the error against
    the fastest round ``thrpt_best_error``."""
    return compare_frames(_frame(measured, ("ok",)), _frame(simulated, ("sim", "sim-oom")))


def compare_frames(measured, predicted):
    """:func:`compare` of two frames of runs (``KEY`` columns, ``mem``, ``thrpt``; the measured
    one also ``thrpt_min`` and ``thrpt_max``)."""
    both = measured.merge(predicted.drop(columns=["thrpt_min", "thrpt_max"], errors="ignore"),
                          on=KEY, suffixes=("_measured", "_predicted"))
    both = both.rename(columns=dict(thrpt_min="thrpt_min_measured",
                                    thrpt_max="thrpt_max_measured"))
    for what in ("mem", "thrpt"):
        both[f"{what}_error"] = both[f"{what}_predicted"] / both[f"{what}_measured"] - 1
    both["thrpt_best_error"] = both["thrpt_predicted"] / both["thrpt_max_measured"] - 1
    return both


def summarise(both) -> Dict[str, float]:
    """Median error, MAPE, Spearman correlation of samples/s, share of memory within 25 %."""
    out: Dict[str, float] = dict(runs=len(both))
    for what in ("mem", "thrpt"):
        err = both[f"{what}_error"]
        out[f"{what}_median_error"] = float(err.median())
        out[f"{what}_mape"] = float(err.abs().mean())
    out["mem_within_25"] = float((both["mem_error"].abs() <= GOALS["memory_within"]).mean())
    ranks = both[["thrpt_measured", "thrpt_predicted", "thrpt_max_measured"]].rank()
    out["thrpt_spearman"] = float(ranks["thrpt_measured"].corr(ranks["thrpt_predicted"]))
    out["thrpt_best_mape"] = float(both["thrpt_best_error"].abs().mean())
    out["thrpt_best_spearman"] = float(ranks["thrpt_max_measured"].corr(
        ranks["thrpt_predicted"]))
    out["thrpt_spread"] = float((both["thrpt_max_measured"] / both["thrpt_min_measured"]
                                 ).median())
    return out


def pairs(both) -> List[Dict[str, object]]:
    """Every Slapo mode against each of its baselines on the same model, ranks and shape."""
    from end2end.spec.modes import MODE_TABLE

    out = []
    index = {tuple(r[k] for k in KEY if k not in ("Impl", "Ckpt", "Knobs", "Batch")) +
             (r["Impl"],): r for _, r in both.iterrows()}
    low, high = GOALS["noise"]
    for key, row in index.items():
        for base in MODE_TABLE[row["Impl"]].baselines if row["Impl"] in MODE_TABLE else ():
            other = index.get(key[:-1] + (base,))
            if other is None:
                continue
            measured = row["thrpt_measured"] / other["thrpt_measured"]
            predicted = row["thrpt_predicted"] / other["thrpt_predicted"]
            judged = not low <= measured <= high
            out.append(dict(slapo=row["Impl"], baseline=base, model=row["Model"],
                            n=int(row["nGPU"]), measured=measured, predicted=predicted,
                            judged=judged, bias=predicted / measured - 1,
                            same_way=(measured > 1) == (predicted > 1) if judged else None))
    return out


def signed_bias(pair_rows) -> float:
    """The median of the pairs' biases (module docstring); 0 without pairs."""
    import statistics

    return statistics.median(p["bias"] for p in pair_rows) if pair_rows else 0.0


def goals_met(summary: Dict[str, float], pair_rows) -> Dict[str, bool]:
    """Each of the issues' goals (:data:`GOALS`): met or not."""
    return dict(memory=summary["mem_within_25"] >= GOALS["memory_share"],
                spearman=summary["thrpt_spearman"] >= GOALS["spearman"],
                mape=summary["thrpt_mape"] <= GOALS["mape"],
                pairs=all(p["same_way"] for p in pair_rows if p["judged"]),
                bias=abs(signed_bias(pair_rows)) <= GOALS["bias"])


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def tables(both, summary: Dict[str, float], pair_rows) -> str:
    """The per-run table, the summary against the goals and the pair table (Markdown)."""
    lines = ["| run | mem measured GB | predicted | error | samples/s measured (rounds) | "
             "predicted | error |", "|---|---|---|---|---|---|---|"]
    for _, r in both.iterrows():
        seq = f"{r['Seq']}" + (f"/{r['DecSeq']}" if r["DecSeq"] else "")
        lines.append(f"| {r['Impl']} {r['Model']} n={r['nGPU']} s={seq} b={r['Batch']} "
                     f"ckpt={r['Ckpt']} | {r['mem_measured']:.3f} | {r['mem_predicted']:.3f} | "
                     f"{r['mem_error']:+.0%} | {r['thrpt_measured']:.3g} "
                     f"({r['thrpt_min_measured']:.3g}-{r['thrpt_max_measured']:.3g}) | "
                     f"{r['thrpt_predicted']:.3g} | {r['thrpt_error']:+.0%} |")
    s, met = summary, goals_met(summary, pair_rows)
    judged = [p for p in pair_rows if p["judged"]]
    lines += ["", f"Runs compared: {s['runs']}. Memory: median error {s['mem_median_error']:+.0%}"
              f", MAPE {s['mem_mape']:.0%}, within 25 %: {s['mem_within_25']:.0%} of runs "
              f"(goal >= 80 %: {_met(met['memory'])}). Samples/s: median error "
              f"{s['thrpt_median_error']:+.0%}, MAPE {s['thrpt_mape']:.0%} (goal <= 35 %: "
              f"{_met(met['mape'])}), Spearman {s['thrpt_spearman']:.2f} (goal >= 0.8: "
              f"{_met(met['spearman'])}). Pairs outside 0.9-1.1: "
              f"{sum(bool(p['same_way']) for p in judged)} of {len(judged)} predicted the same "
              f"way (goal: all: {_met(met['pairs'])}); signed bias of the predicted vs "
              f"measured ratios over all {len(pair_rows)} pairs: median "
              f"{signed_bias(pair_rows):+.1%} (goal within +-5 %: {_met(met['bias'])}), "
              f"{sum(p['bias'] > 0 for p in pair_rows)} of {len(pair_rows)} above 0. Against "
              f"each run's fastest round "
              f"(other work on the machine only slows a run down; the median run's fastest "
              f"round is {s['thrpt_spread']:.2f}x its slowest): samples/s MAPE "
              f"{s['thrpt_best_mape']:.0%}, Spearman {s['thrpt_best_spearman']:.2f}.", "",
              "| pair | model | n | measured | predicted | bias | same way |",
              "|---|---|---|---|---|---|---|"]
    for p in pair_rows:
        way = "within noise" if not p["judged"] else ("yes" if p["same_way"] else "**no**")
        lines.append(f"| {p['slapo']} / {p['baseline']} | {p['model']} | {p['n']} | "
                     f"{p['measured']:.2f}x | {p['predicted']:.2f}x | {p['bias']:+.0%} | "
                     f"{way} |")
    return "\n".join(lines) + "\n"


def report(both, summary: Dict[str, float], pair_rows, command: str) -> str:
    """The Markdown report (module docstring)."""
    return "\n".join([f"CPU proof of the simulator: {datetime.date.today()}, "
                      f"{_machine()}, commit {_commit()}", "", f"    {command}", "",
                      tables(both, summary, pair_rows)])


def _machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    from end2end.cli import HelpFormatter

    p = argparse.ArgumentParser(prog="python -m end2end.simulate.proof",
                                formatter_class=HelpFormatter, description=__doc__)
    p.add_argument("config", help="a CPU benchmark config (e.g. end2end/configs/cpu.cfg)")
    p.add_argument("--out", default=None, help="directory of the rows and the report "
                   "(default: results/proof-<config>)")
    p.add_argument("--repeat", type=int, default=3, help="measured rounds (median per run)")
    p.add_argument("--measured", default="", metavar="FILE",
                   help="compare with the rows of this results file (measured earlier, e.g. "
                        "docs/results/cpu.tsv) instead of measuring: simulate only")
    p.add_argument("--only", action="append", default=[], metavar="WORD",
                   help="simulate only runs whose label contains WORD (repeatable)")
    p.add_argument("--calibrate", action="store_true",
                   help="measure the cpu profile first, in this job, before the sweep (into "
                        "--calibration FILE, default DIR/cpu_profile.json)")
    p.add_argument("--calibration", default="", help="the cpu profile's calibration file "
                   "(e.g. docs/results/cpu_profile.json; default: ~/.cache/slapo/"
                   "cpu_profile.json)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    from end2end.cli import configure_logging, report_errors

    args = build_parser().parse_args(argv)
    configure_logging()
    return report_errors("end2end.simulate.proof", lambda: _prove(args, argv), debug=False)


def _prove(args: argparse.Namespace, argv: Optional[Sequence[str]]) -> int:
    from end2end.simulate.__main__ import main as simulate

    out = Path(args.out or f"results/proof-{Path(args.config).stem}")
    out.mkdir(parents=True, exist_ok=True)
    simulated = out / "simulated.tsv"
    command = "python -m end2end.simulate.proof " + " ".join(
        sys.argv[1:] if argv is None else argv)
    calibration = args.calibration
    if args.calibrate:  # measured first, on the machine as the sweep will find it
        from end2end.simulate.calibrate import describe
        from end2end.simulate.calibration.cpu import cpu_profile

        calibration = calibration or str(out / "cpu_profile.json")
        print(describe(cpu_profile(calibration, recalibrate=True)), flush=True)
    if args.measured:
        measured = Path(args.measured)
        if not measured.is_file():
            raise ConfigError(f"--measured {measured}: no such results file",
                              call="end2end.simulate.proof",
                              hint="give a results TSV of the config's measured runs")
    else:
        measured = out / "measured.tsv"
        subprocess.run([sys.executable, "-m", "end2end.sweep", args.config, "--results",
                        str(measured), "--device", "cpu", "--repeat", str(args.repeat)],
                       check=False)
    sim_args = [args.config, "--device", "cpu", "--results", str(simulated)]
    sim_args += [a for w in args.only for a in ("--only", w)]
    sim_args += ["--calibration", calibration] if calibration else []
    status = simulate(sim_args)
    if status:
        return status
    (out / "simulated.cmd").write_text(command + "\n")
    both = compare(measured, simulated)
    if both.empty:
        print("end2end.simulate.proof: no run has both a measured ok row and a simulated row",
              file=sys.stderr)
        return 1
    from end2end.simulate.cost.profiles import get_profile

    text = report(both, summarise(both), pairs(both), command)
    text += f"\nPredicted with the {get_profile('cpu', calibration or None).provenance}.\n"
    (out / "proof.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
