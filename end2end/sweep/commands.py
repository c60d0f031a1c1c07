"""Command lines that launch the training driver ``end2end/driver/bench.py`` for one run.

The driver's CLI (documented in end2end/README.md)::

    python -m end2end.bench --mode MODE --model MODEL --seq-len S --dec-seq-len D \\
        --batch-size B --ckpt C --results FILE [--steps N --warmup W --dtype fp32|fp16|bf16 \\
        --tp T --pp P --micro-batch-size M --device cpu|cuda]

run under ``torchrun`` (one process per GPU/rank; the driver reads RANK/WORLD_SIZE). Single
node: ``torchrun --standalone --nproc_per_node n``. Multi-node: either one ``torchrun`` per node
with a c10d rendezvous, or DeepSpeed's launcher with a hostfile (``deepspeed --module``).
"""

from __future__ import annotations

import shlex
from typing import List, Optional, Sequence

from end2end.spec.config_file import RunSpec

__all__ = ["bench_args", "single_node_command", "torchrun_node_command", "deepspeed_command",
           "hostfile_text", "shell_join"]


def bench_args(spec: RunSpec, results: str, extra: Sequence[str] = ()) -> List[str]:
    """``-m end2end.bench`` plus the run's arguments."""
    return ["-m", "end2end.bench", *spec.cli_args(), "--results", str(results), *extra]


def single_node_command(spec: RunSpec, results: str, extra: Sequence[str] = (),
                        torchrun: Sequence[str] = ("torchrun",)) -> List[str]:
    """``torchrun --standalone --nproc_per_node n -m end2end.bench ...`` on this machine
    (``torchrun=(sys.executable, "-m", "torch.distributed.run")`` avoids relying on PATH)."""
    return [*torchrun, "--standalone", f"--nproc_per_node={spec.n}",
            *bench_args(spec, results, extra)]


def torchrun_node_command(spec: RunSpec, results: str, nnodes: int, nproc_per_node: int,
                          master_addr: str, master_port: int = 29500, job_id: str = "slapo",
                          extra: Sequence[str] = (), torchrun: Sequence[str] = ("torchrun",),
                          is_host: Optional[bool] = None,
                          join_timeout: Optional[int] = None) -> List[str]:
    """The command to start on *every* node (c10d rendezvous at ``master_addr:master_port``).
    ``is_host``: whether this node's agent hosts the rendezvous store (``--rdzv_conf``; needed
    when several "nodes" share one machine, where torchrun cannot tell them apart).
    ``join_timeout``: seconds an agent waits for every node to join (torchrun's default: 600)."""
    if nnodes * nproc_per_node != spec.n:
        raise ValueError(f"{nnodes} nodes x {nproc_per_node} GPUs != n={spec.n}")
    pairs = ([] if is_host is None else [f"is_host={int(is_host)}"]) + \
        ([] if join_timeout is None else [f"join_timeout={join_timeout}"])
    conf = [f"--rdzv_conf={','.join(pairs)}"] if pairs else []
    return [*([torchrun] if isinstance(torchrun, str) else torchrun), f"--nnodes={nnodes}",
            f"--nproc_per_node={nproc_per_node}", "--rdzv_backend=c10d",
            f"--rdzv_endpoint={master_addr}:{master_port}", f"--rdzv_id={job_id}", *conf,
            *bench_args(spec, results, extra)]


def hostfile_text(hosts: Sequence[str], slots: int) -> str:
    """A DeepSpeed hostfile: ``host slots=N`` per line."""
    return "".join(f"{h} slots={slots}\n" for h in hosts)


def deepspeed_command(spec: RunSpec, results: str, hostfile: str, nnodes: int,
                      gpus_per_node: int, master_addr: Optional[str] = None,
                      master_port: int = 29500, extra: Sequence[str] = (),
                      launcher: Sequence[str] = ("deepspeed",),
                      ssh_check: bool = True) -> List[str]:
    """The DeepSpeed launcher command (run once, on the first host; it ssh-es to the others).
    ``--no_local_rank``: the driver reads LOCAL_RANK from the environment and has no
    ``--local_rank`` option. ``ssh_check=False`` (``--no_ssh_check``): a hostfile of one
    ``localhost`` line runs here without ssh (DeepSpeed otherwise tries ``ssh localhost``)."""
    if nnodes * gpus_per_node != spec.n:
        raise ValueError(f"{nnodes} nodes x {gpus_per_node} GPUs != n={spec.n}")
    cmd = [*launcher, f"--hostfile={hostfile}", f"--num_nodes={nnodes}",
           f"--num_gpus={gpus_per_node}", f"--master_port={master_port}", "--no_local_rank"]
    if not ssh_check:
        cmd.append("--no_ssh_check")
    if master_addr:
        cmd.append(f"--master_addr={master_addr}")
    args = bench_args(spec, results, extra)
    return cmd + ["--module", args[1], *args[2:]]


def shell_join(cmd: Sequence[str]) -> str:
    """A copy-pasteable shell line."""
    return shlex.join(list(cmd))
