"""Slurm for the multi-node launcher (``--launcher slurm``): one ``sbatch`` script per run.

The script asks for ``nnodes`` nodes with one task each; ``srun`` starts one torchrun agent per
node, with the c10d rendezvous on the job's first node (``scontrol show hostnames``) and the
job id as rendezvous id. Rank 0 appends the row to the results file, which must be on a
filesystem every node sees. The job's time limit (``#SBATCH --time``) comes from ``--timeout``.
The launcher submits with ``sbatch --parsable --wait`` (it waits for the job), then asks
``scontrol show job`` how the job ended: a job that failed, was cancelled or hit its time
limit without a row from rank 0 gets a row naming Slurm's state and reason. An interrupted
launcher cancels the job (``scancel``) before it exits.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

from end2end.results.store import mark, rollback
from end2end.spec.config_file import RunSpec
from end2end.sweep.commands import shell_join, torchrun_node_command
from end2end.sweep.outcome import log_path, rows_for, settle_row
from end2end.sweep.procs import run_group

__all__ = ["sbatch_script", "run_slurm_job", "job_info", "slurm_time"]

_HEAD, _JOB = "SLAPO_HEAD_NODE", "SLAPO_JOB_ID"  # placeholders for shell variables


def slurm_time(timeout: float) -> str:
    """``--time`` for a timeout in seconds: whole minutes, rounded up (``D-HH:MM:SS``)."""
    minutes = max(1, math.ceil(timeout / 60))
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def sbatch_script(spec: RunSpec, nnodes: int, gpus_per_node: int, results: str, workdir: str,
                  timeout: float, port: int, extra: Sequence[str], output: str,
                  partition: Optional[str] = None, gpus: bool = True,
                  python: str = sys.executable) -> str:
    """The ``sbatch`` script of one run (what ``--dry-run`` prints; submit it as it is)."""
    job = "fig8-" + "-".join(p.replace("/", "_") for p in (spec.mode, spec.model, str(spec.n)))
    node = torchrun_node_command(spec, str(Path(results).resolve()), nnodes, gpus_per_node,
                                 _HEAD, port, _JOB, extra,
                                 torchrun=(python, "-m", "torch.distributed.run"))
    line = shell_join(node).replace(_HEAD, '"$head"').replace(_JOB, '"$SLURM_JOB_ID"')
    header = [f"--job-name={job}", f"--nodes={nnodes}", "--ntasks-per-node=1",
              f"--cpus-per-task={gpus_per_node}" if not gpus else
              f"--gpus-per-node={gpus_per_node}", f"--time={slurm_time(timeout)}",
              f"--output={output}"] + ([f"--partition={partition}"] if partition else [])
    return "\n".join(["#!/bin/bash", f"# {spec.label}: {nnodes} node(s) x {gpus_per_node}",
                      *(f"#SBATCH {h}" for h in header),
                      "set -euo pipefail",
                      f"cd {shell_join([str(Path(workdir).resolve())])}",
                      "# the rendezvous is hosted by the job's first node",
                      'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                      f"srun --kill-on-bad-exit=1 {line}", ""])


def job_info(job_id: str) -> Dict[str, str]:
    """``scontrol show job -o ID`` as a dict (JobState, Reason, ExitCode ...); {} if unknown."""
    try:
        text = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                              text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(re.findall(r"(\w+)=(\S*)", text))


def _job_id(log: Path) -> Optional[str]:
    try:
        lines = log.read_text(errors="replace").splitlines()[1:]
    except OSError:
        return None
    ids = [ln.split(";")[0].strip() for ln in lines if re.fullmatch(r"\d+(;\S+)?", ln.strip())]
    return ids[0] if ids else None


def _cancel(log: Path) -> None:
    job = _job_id(log)
    if job:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)


def run_slurm_job(spec: RunSpec, script: Path, out: Path, env: dict) -> str:
    """Submit ``script``, wait for the job, make sure the run ends as one row; returns the
    row's status. Ctrl-C cancels the job and cuts its rows (it is pending again)."""
    log = log_path(out, spec, ".sbatch")
    before, start = rows_for(out, spec), mark(out)
    try:
        group = run_group([["sbatch", "--parsable", "--wait", str(script)]], [log], math.inf)
    except BaseException:
        _cancel(log)
        rollback(out, start)
        raise
    job = _job_id(log)
    info = job_info(job) if job else {}
    state = info.get("JobState", "UNKNOWN")
    if group.start_errors:
        reason = f"sbatch did not start: {group.start_errors[0]}"
    elif job is None:
        reason = f"sbatch exit code {group.codes[0]}: no job was submitted (log: {log})"
    else:
        reason = (f"slurm job {job} {state} (Reason={info.get('Reason', '?')}, "
                  f"ExitCode={info.get('ExitCode', '?')}; job log: {script.with_suffix('.out')}"
                  f", sbatch log: {log})")
    replace = state in ("TIMEOUT", "CANCELLED", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY")
    return settle_row(out, spec, before, start, replace, state == "TIMEOUT", reason, env)
