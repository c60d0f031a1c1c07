"""What ``python -m end2end.plan`` prints and writes: the summary of the search, the ranked
table, the best candidate as a config and a launch command beside the best baseline, one
candidate explained, and the JSON lines of ``--json``."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from end2end.plan.search import Evaluated, PlanResult
from end2end.spec.modes import get_mode
from end2end.sweep.commands import shell_join, single_node_command, torchrun_node_command

__all__ = ["summary_lines", "table_lines", "best_lines", "explain_lines", "json_rows",
           "launch_lines"]

RESULTS = "results/plan.tsv"


def summary_lines(r: PlanResult) -> List[str]:
    """What was searched, pruned and simulated, and how long it took."""
    pruned = ", ".join(f"{n} by {rule}" for rule, n in r.space.pruned.most_common()) or "none"
    out = [f"plan: {r.model} on {r.cluster.text} ({r.cluster.gpus} devices), seq {r.seq}, "
           f"global batch {r.batch}, {r.dtype}",
           f"space: {r.space.total} candidates; pruned by rule: {pruned}; "
           f"{len(r.space.candidates)} left",
           f"simulated {len(r.ranked)} candidates ({r.simulations} simulations, {r.cached} "
           f"from the cache), {r.skipped_after_oom} skipped after a predicted OOM, "
           f"{r.not_simulated} not simulated (budget, --max-candidates); {r.wall_s:.0f} s"]
    out += [f"note: {n}" for n in r.notes]
    return out


def _dominant(e: Evaluated, parts: int = 2) -> str:
    p = e.prediction
    if p is None or not p.phases:
        return "-"
    return ", ".join(f"{k} {share:.0%}" for k, share in p.dominant[:parts])


def _tokens_per_gpu(e: Evaluated) -> float:
    c, p = e.candidate, e.prediction
    return p.samples_per_s * (c.seq + c.dec) / c.n if p else 0.0


def _margin(e: Evaluated, r: PlanResult) -> float:
    return r.cluster.memory_bytes / 1e9 - (e.prediction.needed_gb if e.prediction else 0.0)


def table_lines(r: PlanResult, top: int) -> List[str]:
    """The ranked table (fitting candidates, then the others, ``top`` rows; ``SP``: the
    recipe's sequence parallelism, the only knob the planner searches)."""
    head = (f"{'#':>3} {'mode':<16}{'TP':>3}{'PP':>3}{'DP':>4}{'MB':>4} {'ckpt':<9} {'SP':<3}"
            f"{'samples/s':>10}{'tok/s/GPU':>11}{'MFU':>7}{'GB/rank':>9}{'margin':>8}  "
            "status   dominant cost")
    out = [head, "-" * len(head)]
    for i, e in enumerate(r.ranked[:top], start=1):
        c, p = e.candidate, e.prediction
        assert p is not None
        sp = "y" if c.sequence_parallel else "-"
        out.append(f"{i:>3} {c.mode:<16}{c.tp:>3}{c.pp:>3}{c.dp:>4}{c.micro:>4} {c.ckpt:<9} {sp:<3}"
                   f"{p.samples_per_s:>10.4g}{_tokens_per_gpu(e):>11.4g}{p.mfu:>7.1%}"
                   f"{p.memory_gb:>9.3g}{_margin(e, r):>8.3g}  {p.status:<8} {_dominant(e)}"
                   + (f" ({p.error[:60]})" if p.status not in ("sim", "sim-oom") else ""))
    return out


def launch_lines(e: Evaluated, r: PlanResult) -> List[str]:
    """The best candidate's launch: torchrun on one node, or on every node / Slurm."""
    spec = e.candidate.run_spec()
    device = ["--device", "cpu" if r.cluster.profile == "cpu" else "cuda"]
    if r.cluster.nodes == 1:
        return ["launch:", "  " + shell_join(single_node_command(spec, RESULTS, device))]
    node = torchrun_node_command(spec, RESULTS, r.cluster.nodes, r.cluster.gpus_per_node,
                                 "MASTER_ADDR", extra=device)
    return [f"launch on each of the {r.cluster.nodes} nodes (MASTER_ADDR: the first node's "
            "address):", "  " + shell_join(node),
            "or, with the config above saved as plan.cfg, through Slurm or ssh:",
            f"  python -m end2end.multi_node.launch --config plan.cfg --launcher slurm "
            f"--slurm-nodes {r.cluster.nodes} --gpus-per-node {r.cluster.gpus_per_node} "
            f"--results {RESULTS}"]


def _why(best: Evaluated, base: Optional[Evaluated]) -> List[str]:
    p = best.prediction
    assert p is not None
    phases = ", ".join(f"{k} {v * 1e3:.4g} ms" for k, v in p.phases.items())
    out = [f"why: step {p.step_time * 1e3:.4g} ms = {phases}"]
    if base is not None and base.prediction is not None:
        q = base.prediction
        theirs = ", ".join(f"{k} {v * 1e3:.4g} ms" for k, v in q.phases.items())
        out.append(f"     the baseline's step {q.step_time * 1e3:.4g} ms = {theirs}; "
                   f"speedup {p.samples_per_s / q.samples_per_s:.2f}x (predicted)")
    return out


def best_lines(r: PlanResult) -> List[str]:
    """The best candidate (config, launch, why) and the best baseline beside it."""
    best, base = r.best, r.best_baseline
    if best is None:
        return ["no simulated candidate is predicted to fit: see the table (sim-oom, fail); "
                "raise --budget or lower --global-batch"]
    p = best.prediction
    assert p is not None
    out = [f"best: {best.candidate.label} ({get_mode(best.candidate.mode).label}): "
           f"{p.samples_per_s:.4g} samples/s predicted, {p.memory_gb:.3g} GB per rank",
           "config:", *("  " + ln for ln in best.candidate.line.splitlines()),
           *launch_lines(best, r)]
    if base is None:
        out.append("best baseline: none simulated fits")
    elif base is not best:
        q = base.prediction
        assert q is not None
        out += [f"best baseline: {base.candidate.label} ({get_mode(base.candidate.mode).label})"
                f": {q.samples_per_s:.4g} samples/s, {q.memory_gb:.3g} GB per rank",
                *("  " + ln for ln in base.candidate.line.splitlines())]
    return out + _why(best, base if base is not best else None)


def explain_lines(r: PlanResult, index: int) -> List[str]:
    """Candidate ``index`` (1-based, the table's #) in full."""
    if not 1 <= index <= len(r.ranked):
        return [f"--explain {index}: the table has {len(r.ranked)} rows"]
    e = r.ranked[index - 1]
    p = e.prediction
    assert p is not None
    depth = (f"extrapolated from {' and '.join(map(str, p.depths))} layers per stage"
             if p.depths else "simulated at full depth")
    out = [f"#{index} {e.candidate.label}: {p.status} {p.error}".rstrip(),
           *("  " + ln for ln in e.candidate.line.splitlines()),
           f"  predicted: {p.samples_per_s:.4g} samples/s, step {p.step_time * 1e3:.4g} ms, "
           f"MFU {p.mfu:.1%}, peak {p.memory_gb:.3g} GB per rank, needs {p.needed_gb:.3g} "
           f"of {r.cluster.memory_bytes / 1e9:.3g} GB ({depth}; {p.seconds:.0f} s)",
           "  step by phase: " + ", ".join(f"{k} {v * 1e3:.4g} ms ({s:.0%})" for (k, s), v in
                                           zip(p.dominant, [p.phases[k] for k, _ in
                                                            p.dominant])),
           "  estimate: " + ", ".join(f"{k} {v * 1e3:.4g} ms" for k, v in e.estimate.items())
           + f", {e.estimated_gb:.3g} GB"]
    return out


def json_rows(r: PlanResult) -> List[Dict[str, Any]]:
    """One object per simulated candidate, best first, with the results file's column names
    (``Impl Model Seq DecSeq nGPU Batch Ckpt Thrpt PerGPUMem MFU StepTime Status Error Device
    TP PP DP Dtype Knobs``) and the planner's own (``MicroBatch``, ``TokensPerGPU``, ``NeededGB``,
    ``MarginGB``, ``Phases``, ``Extrapolated``, ``Rank``, ``line``)."""
    rows = []
    for rank, e in enumerate(r.ranked, start=1):
        c, p = e.candidate, e.prediction
        assert p is not None
        rows.append(dict(
            Rank=rank, Impl=c.mode, Model=c.model, Seq=c.seq, DecSeq=c.dec, nGPU=c.n,
            Batch=c.batch, Ckpt=c.ckpt, Thrpt=p.samples_per_s, PerGPUMem=p.memory_gb,
            MFU=p.mfu, StepTime=p.step_time, Status=p.status, Error=p.error,
            Device=f"{r.cluster.profile} (predicted)", TP=c.tp, PP=c.pp, DP=c.dp,
            Dtype=c.dtype, Knobs=c.knobs, MicroBatch=c.micro, TokensPerGPU=_tokens_per_gpu(e),
            NeededGB=p.needed_gb, MarginGB=_margin(e, r), Phases=p.phases,
            Extrapolated=list(p.depths), Cluster=r.cluster.text, line=c.line))
    return rows


def json_text(r: PlanResult) -> str:
    """``--json``'s file: :func:`json_rows`, one JSON object per line."""
    return "".join(json.dumps(row) + "\n" for row in json_rows(r))
