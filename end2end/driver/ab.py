"""Paired A/B comparison of two modes in one job: the finest-grained speed check we have.

    torchrun --standalone --nproc_per_node 2 -m end2end.ab megatron slapo-megatron \\
        --model cpu/t5 --seq-len 256 --dec-seq-len 128 --batch-size 4 [--steps 8] [--warmup 2] \\
        [--knob-b NAME=VALUE ...] [--profile DIR]

One process group builds both systems (the same runners, layouts and batches as
:mod:`end2end.driver.bench`), warms each up, then alternates their training steps ``A B A B ...``:
each step is timed on its own (device sync + barrier before and after, the slowest rank's time), so
the machine's drift hits both alike and every A step has a B step next to it. Rank 0 prints each
system's median step time with its min-max range and the B/A speed ratio with the range of the
per-pair ratios (``~`` when that range includes 1.0: within noise, :mod:`end2end.results.stats`);
with ``--profile DIR`` it then profiles one more step of each (``python -m end2end.profiling``
compares the two files op by op). Nothing is written to a results file: this is a developer's check
of one pair, the sweep (``run_all_single_node.sh``) is where numbers for the figures come from.
"""

from __future__ import annotations

import argparse
import functools
import time
from dataclasses import replace
from typing import List, Optional, Sequence

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option documented)."""
    from end2end.cli import HelpFormatter, add_workload_arguments, number
    from end2end.spec.modes import MODES

    p = argparse.ArgumentParser(
        prog="python -m end2end.ab", formatter_class=HelpFormatter,
        description="Alternate the training steps of two modes in one job and compare them "
                    "pair by pair (run under torchrun).")
    p.add_argument("mode_a", choices=MODES, help="the baseline system")
    p.add_argument("mode_b", choices=MODES, help="the system compared with it (ratio B/A)")
    add_workload_arguments(p)
    p.add_argument("--steps", type=number(int, minimum=1), default=8,
                   help="timed steps of each system (default: 8)")
    p.add_argument("--warmup", type=number(int, minimum=0), default=2,
                   help="untimed steps of each system first (default: 2)")
    p.add_argument("--knob-a", action="append", default=[], metavar="NAME=VALUE",
                   help="a model-schedule knob of system A (a Slapo mode; repeatable)")
    p.add_argument("--knob-b", action="append", default=[], metavar="NAME=VALUE",
                   help="a model-schedule knob of system B (a Slapo mode; repeatable)")
    p.add_argument("--profile", metavar="DIR", default=None,
                   help="then profile one step of each on every rank into DIR")
    return p


def _spec(args: argparse.Namespace, mode: str, knobs: Sequence[str], world_size: int):
    from end2end.driver.bench import DEFAULTS, knob_text
    from end2end.spec.config_file import make_run_spec

    spec = make_run_spec(mode, args.model, world_size, args.seq_len, args.dec_seq_len,
                         args.batch_size, "0", steps=args.steps, warmup=args.warmup,
                         dtype=DEFAULTS["dtype"])
    return replace(spec, knobs=knob_text(knobs))


def _label(spec) -> str:
    return spec.mode + (f" [{spec.knobs}]" if spec.knobs else "")


def run(args: argparse.Namespace) -> Optional[str]:
    """Build both systems, alternate their steps; returns rank 0's report (None elsewhere)."""
    from slapo.runtime.distributed import init_distributed

    from end2end.driver.assemble import build_runner, import_runtime, rank_batch
    from end2end.driver.measure import StepTimer
    from end2end.results.stats import Samples
    from end2end.spec.layout import run_layout

    env = init_distributed()
    specs = [_spec(args, m, k, env.world_size) for m, k in
             ((args.mode_a, args.knob_a), (args.mode_b, args.knob_b))]
    runners, batches = [], []
    for spec in specs:
        import_runtime(spec.mode, bool(spec.fp32_masters))
        layout = run_layout(spec)
        runners.append(build_runner(spec, layout, None, env.device))
        batches.append(rank_batch(spec, layout, env.rank, env.device, None))
    for runner, batch in zip(runners, batches):
        for _ in range(args.warmup):
            runner.train_step(batch)
    times: List[List[float]] = [[], []]
    for _ in range(args.steps):
        for i, (runner, batch) in enumerate(zip(runners, batches)):
            timer = StepTimer(env.device)
            timer.start()
            runner.train_step(batch)
            times[i].append(timer.stop())
    if args.profile:
        from end2end.driver.profiling import profile_step

        for spec, runner, batch in zip(specs, runners, batches):
            profile_step(functools.partial(runner.train_step, batch), args.profile,
                         f"ab-{_label(spec)}", env.rank, env.device.type == "cuda")
    if env.rank:
        return None
    a, b = (Samples.of(enumerate(t)) for t in times)
    speed = a.ratio(b)  # time A / time B = speed B / speed A
    lines = [f"{args.model}, {env.world_size} rank(s), {args.steps} alternating steps each "
             f"({time.strftime('%Y-%m-%d %H:%M %Z')}): step time median (min-max)"]
    for spec, s in zip(specs, (a, b)):
        lines.append(f"  {_label(spec):<32} {s.median:.4f} s ({s.lo:.4f}-{s.hi:.4f})")
    lines.append(f"  speed {_label(specs[1])} / {_label(specs[0])}: {speed}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    report = run(args)
    if report:
        print(report, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
