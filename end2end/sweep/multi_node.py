"""Figure 8 launcher: run a multi-node config (GPT-10B, LLaMA-7B on 16/32/64 GPUs).

    # print the exact commands for 2 nodes (16 GPUs), torchrun rendezvous:
    python -m end2end.multi_node.launch --hosts node0,node1 --gpus-per-node 8 --dry-run
    # the same through DeepSpeed's launcher and a hostfile (written next to the results):
    python -m end2end.multi_node.launch --hostfile hosts.txt --launcher deepspeed --dry-run
    # run everything that fits the given hosts (resumable, like end2end.sweep):
    python -m end2end.multi_node.launch --hostfile hosts.txt --results results/fig8.tsv

Each run of the config (default ``end2end/configs/multi_node_fig8.cfg``) with ``n`` GPUs uses
the first ``n / gpus_per_node`` hosts. ``torchrun``: the same command is started on every node
(over ``ssh``, in ``--workdir``) with a c10d rendezvous on the first host. ``deepspeed``: one
command on the first host; DeepSpeed's launcher reaches the others through the hostfile (pdsh).
The results file must be on a filesystem shared by the first host (rank 0 writes it).

Hosts named ``localhost``/``127.0.0.1`` (or this machine's name) run their node command here,
without ``ssh``; several such "nodes" on one machine each get their own torchrun agent, the
first hosting the rendezvous. With ``--device cpu`` this runs the multi-node code path on one
CPU machine (gloo), e.g. two 1-rank nodes::

    python -m end2end.multi_node.launch --hosts localhost,localhost --gpus-per-node 1 \
        --device cpu --config my_tiny.cfg --results results/local-nodes.tsv
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from end2end.spec.config_file import RunSpec, load_runs
from end2end.sweep.commands import (deepspeed_command, hostfile_text, shell_join,
                                    torchrun_node_command)
from end2end.results.store import pending_runs

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "multi_node_fig8.cfg"


def read_hosts(hosts: Optional[str], hostfile: Optional[str]) -> List[str]:
    """Hosts from ``--hosts a,b`` or a hostfile (``host [slots=N]`` lines, ``#`` comments)."""
    if hosts:
        return [h for h in hosts.split(",") if h]
    if hostfile:
        lines = Path(hostfile).read_text().splitlines()
        return [ln.split()[0] for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    raise SystemExit("give --hosts h1,h2,... or --hostfile FILE")


def is_local(host: str) -> bool:
    """Whether ``host`` names this machine (its node command runs here, without ssh)."""
    return host in ("localhost", "127.0.0.1", socket.gethostname())


def commands_for(spec: RunSpec, hosts: Sequence[str], gpus_per_node: int, launcher: str,
                 results: str, hostfile: str, port: int, workdir: str,
                 device: str = "cuda") -> List[List[str]]:
    """The command lines of one run: one per node (torchrun, prefixed with ssh unless the host
    is this machine) or one (DeepSpeed's launcher)."""
    nnodes = spec.n // gpus_per_node
    used = list(hosts[:nnodes])
    extra = ["--device", device]
    if launcher == "deepspeed":
        return [deepspeed_command(spec, results, hostfile, nnodes, gpus_per_node, used[0],
                                  port, extra)]
    job = "fig8-" + "-".join(part.replace("/", "_") for part in (spec.mode, spec.model,
                                                                  str(spec.n)))
    shared = sum(map(is_local, used)) > 1  # several nodes on this machine: say who hosts
    cmds = []
    for i, host in enumerate(used):
        if is_local(host):
            cmds.append(torchrun_node_command(
                spec, results, nnodes, gpus_per_node, used[0], port, job, extra,
                torchrun=(sys.executable, "-m", "torch.distributed.run"),
                is_host=(i == 0) if shared else None))
        else:
            node_cmd = torchrun_node_command(spec, results, nnodes, gpus_per_node, used[0],
                                             port, job, extra)
            cmds.append(["ssh", host, f"cd {workdir} && {shell_join(node_cmd)}"])
    return cmds


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Launch the Figure 8 multi-node runs.")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--hosts", help="comma-separated host names (first = master)")
    parser.add_argument("--hostfile", help="DeepSpeed-style hostfile (host slots=N)")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--launcher", choices=("torchrun", "deepspeed"), default="torchrun")
    parser.add_argument("--results", default="results/fig8.tsv")
    parser.add_argument("--port", type=int, default=29500)
    parser.add_argument("--workdir", default=str(Path.cwd()), help="repository root on nodes")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="the driver's device (cpu: gloo ranks, e.g. local test nodes)")
    parser.add_argument("--only-n", type=int, nargs="*", help="only these GPU counts")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)

    hosts = read_hosts(args.hosts, args.hostfile)
    capacity = len(hosts) * args.gpus_per_node
    runs = [r for r in load_runs(args.config, max_devices=capacity)
            if r.n <= capacity and r.n % args.gpus_per_node == 0
            and (not args.only_n or r.n in args.only_n)]
    todo = pending_runs(runs, args.results)
    hostfile = args.hostfile or str(Path(args.results).with_suffix(".hostfile"))
    if args.launcher == "deepspeed" and not args.hostfile:
        text = hostfile_text(hosts, args.gpus_per_node)
        if args.dry_run:
            print(f"# hostfile {hostfile}:\n" + "".join("#   " + ln + "\n"
                                                      for ln in text.splitlines()), end="")
        else:
            Path(hostfile).parent.mkdir(parents=True, exist_ok=True)
            Path(hostfile).write_text(text)
    print(f"# {len(todo)} run(s) for {len(hosts)} node(s) x {args.gpus_per_node} GPUs")
    failures = 0
    for spec in todo:
        cmds = commands_for(spec, hosts, args.gpus_per_node, args.launcher, args.results,
                            hostfile, args.port, args.workdir, args.device)
        print(f"# {spec.label} (tp, pp, dp) = {spec.parallel_sizes}")
        for cmd in cmds:
            print(shell_join(cmd))
        if args.dry_run:
            continue
        procs = [subprocess.Popen(cmd, cwd=args.workdir) for cmd in cmds]
        failures += sum(p.wait() != 0 for p in procs) > 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
