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
The results file must be on a filesystem shared by the first host (rank 0 writes it). A
hostfile, config or usage mistake is one line on stderr (``file:line: what. Hint: ...``) and
exit status 2.

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

from slapo.errors import ConfigError

from end2end.cli import HelpFormatter, number, report_errors
from end2end.spec.config_file import RunSpec, load_runs
from end2end.sweep.commands import (deepspeed_command, hostfile_text, shell_join,
                                    torchrun_node_command)
from end2end.results.store import pending_runs

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "multi_node_fig8.cfg"


def read_hosts(hosts: Optional[str], hostfile: Optional[str]) -> List[str]:
    """Hosts from ``--hosts a,b`` or a hostfile (:func:`read_hostfile`)."""
    if hosts:
        names = [h for h in hosts.split(",") if h.strip()]
        if not names:
            raise ConfigError(f"--hosts {hosts!r} names no host",
                              hint="give comma-separated host names, e.g. --hosts node0,node1")
        return [h.strip() for h in names]
    if hostfile:
        return read_hostfile(hostfile)
    raise ConfigError("no hosts", hint="give --hosts h1,h2,... or --hostfile FILE")


def read_hostfile(path: str) -> List[str]:
    """The hosts of a DeepSpeed-style hostfile: ``host [slots=N]`` per line, ``#`` comments.
    A mistake is a :class:`ConfigError` ``path:line: what. Hint: ...``."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else f"not text ({exc.reason})"
        raise ConfigError(f"cannot read hostfile {path!r}: {reason}",
                          hint="give a file of 'host slots=N' lines (--hostfile)") from None
    hosts = []
    for lineno, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        for extra in fields[1:]:
            key, _, value = extra.partition("=")
            if key != "slots" or not value.isdigit() or int(value) < 1:
                raise ConfigError(f"{path}:{lineno}: {extra!r} is not 'slots=N' (N >= 1)",
                                  hint="write each line as 'HOST slots=GPUS', e.g. "
                                       "'node0 slots=8'")
        hosts.append(fields[0])
    if not hosts:
        raise ConfigError(f"{path}: no hosts (the file is empty or has only comments)",
                          hint="write one 'HOST slots=GPUS' line per node")
    return hosts


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


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m end2end.multi_node.launch`` command line (every option documented)."""
    p = argparse.ArgumentParser(
        prog="python -m end2end.multi_node.launch", formatter_class=HelpFormatter,
        description="Launch the Figure 8 multi-node runs: print the commands of the pending "
                    "runs (a '#' line names each run) and run them, resumably.",
        epilog="Exit status: 0 every command succeeded; 1 some run failed; 2 usage, config or "
               "hostfile error (one line on stderr).")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="config file")
    p.add_argument("--hosts", help="comma-separated host names (first = master)")
    p.add_argument("--hostfile", help="DeepSpeed-style hostfile ('host slots=N' lines)")
    p.add_argument("--gpus-per-node", type=number(int, minimum=1), default=8,
                   help="GPUs (ranks) per node")
    p.add_argument("--launcher", choices=("torchrun", "deepspeed"), default="torchrun",
                   help="torchrun on every node, or DeepSpeed's launcher on the first")
    p.add_argument("--results", default="results/fig8.tsv", help="results TSV to append to")
    p.add_argument("--port", type=number(int, minimum=1), default=29500,
                   help="rendezvous port on the first host")
    p.add_argument("--workdir", default=str(Path.cwd()), help="repository root on nodes")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="the driver's device (cpu: gloo ranks, e.g. local test nodes)")
    p.add_argument("--only-n", type=int, nargs="*", help="only these GPU counts")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    p.add_argument("--debug", action="store_true",
                   help="show the full traceback of a config/hostfile error")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status (see ``--help``'s epilog)."""
    args = build_parser().parse_args(argv)
    return report_errors("end2end.multi_node.launch", lambda: _launch(args), args.debug)


def _launch(args: argparse.Namespace) -> int:
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
    # the output is a script: '#' lines say what follows, the other lines are the commands
    print(f"# {len(todo)} run(s) for {len(hosts)} node(s) x {args.gpus_per_node} GPUs")
    failures = 0
    for spec in todo:
        cmds = commands_for(spec, hosts, args.gpus_per_node, args.launcher, args.results,
                            hostfile, args.port, args.workdir, args.device)
        print(f"# {spec.label} (tp, pp, dp) = {spec.parallel_sizes}", flush=True)
        for cmd in cmds:
            print(shell_join(cmd), flush=True)
        if args.dry_run:
            continue
        procs = [subprocess.Popen(cmd, cwd=args.workdir) for cmd in cmds]
        failures += sum(p.wait() != 0 for p in procs) > 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
