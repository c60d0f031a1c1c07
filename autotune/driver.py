"""One tuning candidate = one run of the benchmark driver: ``end2end.bench`` under torchrun, one
results row, printed back as the JSON line that ``slapo.autotune``'s command objective reads.

::

    python -m autotune.driver --mode slapo-megatron --model cpu/bert --gpus 2 --seq-len 256 \\
        --batch-size {batch_size} --ckpt {ckpt_ratio} --results results/autotune-bert.tsv \\
        [--knob NAME=VALUE ...] [--steps S --warmup W] [--timeout 600] \\
        [--mem-budget-gb X --device cpu ...]      # anything else goes to end2end.bench

The run is validated and launched exactly as a sweep launches a config line
(``make_run_spec``, ``single_node_command`` with ``torchrun --standalone``, the whole process
tree stopped on a timeout), with its log in ``RESULTS.logs/``. Its row is read back from the
results file: ``{"status", "throughput" (samples/s), "memory_gb" (peak per rank), "error",
"step_time", "mfu", "config_line"}``; ``config_line`` is the config text (pragmas and the
line) that reproduces the run in a sweep. A run that wrote no row (killed, timed out) gets a
``fail``/``timeout`` row here, as in the sweep, so every candidate is a row. With
``--mem-budget-gb`` a run over the budget is an ``oom`` row (on CPU the OOM is a budget, see
``end2end/driver/measure.py``). Invalid arguments (a batch the ranks cannot split ...) print a
``fail`` result naming the problem and write no row.

As in a sweep, the machine is watched over the run (:mod:`end2end.sweep.quiet`): the verdict
goes into the row's ``Machine`` cell and the result's ``machine``. ``--require-quiet`` waits for
a quiet machine first, at most ``--quiet-wait`` seconds, then refuses: one line on stderr, exit
status :data:`REFUSED`, on which the tuner stops without storing the candidate.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["run_candidate", "config_text", "candidate_arguments", "cpu_command", "main"]

TORCHRUN = (sys.executable, "-m", "torch.distributed.run")
#: The exit status of a refused candidate: slapo.autotune's command objective stops the study on
#: it (``slapo.autotune.objective.REFUSED``, EX_TEMPFAIL), nothing stored for the candidate.
REFUSED = 75
#: Seconds ``--require-quiet`` may wait; set, :func:`cpu_command` asks for a quiet machine.
QUIET_WAIT_ENV = "AUTOTUNE_QUIET_WAIT"


def candidate_arguments(mode: str, model: str, gpus: int, seq_len: int, **options) -> List[str]:
    """A space file's run of one candidate as arguments, shared by its ``command`` (this driver)
    and its ``predict`` (``end2end.simulate.one``): mode, model, ranks, sequence, the candidate's
    ``{batch_size}`` and ``{ckpt_ratio}``, then each option as ``--name value``."""
    args = ["--mode", mode, "--model", model, "--gpus", str(gpus), "--seq-len", str(seq_len),
            "--batch-size", "{batch_size}", "--ckpt", "{ckpt_ratio}"]
    for name, value in options.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    return args


def cpu_command(run: Sequence[str], results: str, mem_budget_gb: float) -> List[str]:
    """The ``command`` of a CPU-scale space: this driver on ``run`` (:func:`candidate_arguments`)
    for 1 warm-up and 2 steps, under a per-rank memory budget (the CPU's OOM), stopped at 240 s
    (the space's ``timeout`` leaves it time to write the row); with ``AUTOTUNE_QUIET_WAIT``
    set (seconds), ``--require-quiet`` (``autotune/run.sh --require-quiet`` sets it)."""
    quiet = os.environ.get(QUIET_WAIT_ENV)
    return [sys.executable, "-m", "autotune.driver", *run, "--results", results, "--steps", "2",
            "--warmup", "1", "--device", "cpu", "--gemm-seconds", "0.1", "--mem-budget-gb",
            str(mem_budget_gb), "--timeout", "240",
            *(["--require-quiet", "--quiet-wait", quiet] if quiet else [])]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m autotune.driver", description=__doc__.split(
        "\n\n")[0], epilog="Unknown options are passed to end2end.bench (e.g. --mem-budget-gb, "
                           "--device, --gemm-seconds, --peak-tflops).")
    p.add_argument("--mode", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--gpus", type=int, required=True, help="ranks (GPUs) of the run")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--dec-seq-len", type=int, default=0)
    p.add_argument("--batch-size", type=int, required=True, help="global batch")
    p.add_argument("--ckpt", required=True, help="CKPT as in a config line")
    p.add_argument("--results", required=True, help="results TSV the row goes to")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE")
    for name in ("--steps", "--warmup", "--tp", "--pp", "--micro-batch-size"):
        p.add_argument(name, type=int, default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before the run is "
                   "stopped (a timeout row)")
    p.add_argument("--require-quiet", action="store_true",
                   help="wait for a quiet machine before the run (end2end/sweep/quiet.py), at "
                        "most --quiet-wait seconds; then refuse: one line on stderr and exit "
                        f"status {REFUSED} (the tuner stops, the candidate stays unmeasured)")
    p.add_argument("--quiet-wait", type=float, default=300.0,
                   help="seconds --require-quiet waits for a quiet machine")
    return p


def config_text(spec) -> str:
    """The config-file text (``#@`` pragmas, then the line) that reproduces ``spec``."""
    options = [f"{k}={v}" for k, v in (("steps", spec.steps), ("warmup", spec.warmup),
                                       ("dtype", spec.dtype), ("tp", spec.tp), ("pp", spec.pp),
                                       ("micro_batch", spec.micro_batch)) if v is not None]
    lines = [f"#@ {' '.join(options)}"] if options else []
    if spec.knobs:
        lines.append(f"#@ knobs={spec.knobs}")
    lines.append(f"{spec.mode} {spec.model} {spec.n} {spec.seq_len} {spec.dec_seq_len} "
                 f"{spec.batch_size} {spec.ckpt}")
    return "\n".join(lines)


def _result(row, spec) -> Dict[str, Any]:
    out: Dict[str, Any] = {"status": row.status, "error": row.error,
                           "config_line": config_text(spec)}
    if row.status == "ok":
        out.update(throughput=row.thrpt, memory_gb=row.per_gpu_mem, step_time=row.step_time,
                   mfu=row.mfu)
    return out


def run_candidate(args: argparse.Namespace, bench_extra: Sequence[str]) -> Dict[str, Any]:
    """Launch the driver for one candidate and return its result (see the module docs)."""
    from slapo.errors import SlapoError

    from end2end.spec.config_file import make_run_spec
    from end2end.spec.knobs import format_knobs
    from end2end.sweep.commands import single_node_command
    from end2end.sweep.procs import run_logged, signal_death
    from end2end.sweep.quiet import Watch, record_verdict
    from end2end.results.store import (ResultRow, append_result, env_columns, mark, read_results,
                                 rollback)

    try:
        spec = make_run_spec(args.mode, args.model, args.gpus, args.seq_len, args.dec_seq_len,
                             args.batch_size, args.ckpt, source="autotune.driver",
                             steps=args.steps, warmup=args.warmup, dtype=args.dtype,
                             tp=args.tp, pp=args.pp, micro_batch=args.micro_batch_size,
                             knobs=format_knobs(args.knob) or None)
    except SlapoError as exc:
        return {"status": "fail", "error": f"invalid run: {exc}"}
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    log = Path(f"{results}.logs") / (f"{spec.mode}-{spec.model.replace('/', '_')}-n{spec.n}-"
                                      f"b{spec.batch_size}-c{spec.ckpt}.log")

    def rows() -> List[Any]:
        if not results.exists():
            return []
        return [r for r in read_results(results, check_twin=False).rows if r.key == spec.key]

    before, start = len(rows()), mark(results)
    with Watch() as watch:
        rc, timed_out = run_logged(single_node_command(spec, str(results), bench_extra,
                                                       TORCHRUN), log, args.timeout)
    if timed_out or (rc != 0 and signal_death(log)):
        rollback(results, start)  # a peer's "connection closed" row would blame the wrong rank
    mine = rows()[before:]
    if not mine:
        from end2end.results.environment import env_dump

        status = "timeout" if timed_out else "fail"
        reason = (f"stopped after the --timeout of {args.timeout:g} s" if timed_out else
                  signal_death(log) or f"the driver exited with status {rc} without a row")
        env = env_dump(None)
        row = ResultRow.from_spec(spec, status, error=f"{reason} (log: {log})",
                                  time=time.strftime("%Y-%m-%dT%H:%M:%S"), **env_columns(env))
        append_result(results, row, env)
        mine = [row]
    record_verdict(results, start, watch.verdict)
    result = _result(mine[-1], spec)
    if watch.verdict is not None:  # the tuner keeps it with the candidate (its extra data)
        result["machine"] = watch.verdict.cell()
    return result


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # run_logged then stops torchrun's whole tree (ranks included)


def _refuse_if_busy(args: argparse.Namespace) -> Optional[str]:
    """With ``--require-quiet``: wait for a quiet machine; the refusal's line when it stays
    busy (None: go ahead)."""
    if not args.require_quiet:
        return None
    from end2end.sweep.quiet import MachineBusy, wait_until_quiet

    try:
        wait_until_quiet(args.quiet_wait, lambda line: print(line, file=sys.stderr, flush=True))
    except MachineBusy as exc:
        return f"autotune.driver: error: {' '.join(str(exc).split())}"
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)  # the tuner's timeout sends SIGTERM first
    args, extra = build_parser().parse_known_args(argv)
    refusal = _refuse_if_busy(args)
    if refusal is not None:
        print(refusal, file=sys.stderr, flush=True)
        return REFUSED
    print(json.dumps(run_candidate(args, extra)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
