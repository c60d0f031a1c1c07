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
``slurm``: one ``sbatch`` script per run (:mod:`end2end.sweep.slurm`). The results file must be
on a filesystem shared by the first host (rank 0 writes it). A hostfile, config or usage
mistake is one line on stderr (``file:line: what. Hint: ...``) and exit status 2.

The safeguards of the single-node sweep hold here too (shared pieces: :mod:`.outcome`,
:mod:`.procs`, :mod:`.lock`, :mod:`.quiet`): the machine the launcher runs on is watched over
every job (its verdict in the row's ``Machine`` cell) and ``--require-quiet`` waits for it to be
quiet before each job, or refuses in one line; ``--timeout`` per run for the whole job (every
node command is stopped on expiry), ``--repeat`` rounds, resume, one launcher per results file,
and one row per run always: a node that dies, is killed, cannot start or never joins the
rendezvous gives a row naming the node and what happened (:func:`failure_reason`). Ctrl-C or
SIGTERM stops every node command with all its processes, cuts the run's rows and exits 130 with
a "resume with" line.
Page: docs/cluster.md.

Hosts named ``localhost``/``127.0.0.1`` (or this machine's name) run their node command here,
without ``ssh``; several such "nodes" on one machine each get their own torchrun agent, the
first hosting the rendezvous. With ``--device cpu`` this runs the multi-node code path on one
CPU machine (gloo), e.g. two 1-rank nodes::

    python -m end2end.multi_node.launch --hosts localhost,localhost --gpus-per-node 1 \
        --device cpu --config my_tiny.cfg --results results/local-nodes.tsv
"""

from __future__ import annotations

import argparse
import shlex
import socket
import sys
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from slapo.errors import ConfigError

from end2end.cli import HelpFormatter, configure_logging, get_logger, number
from end2end.results.environment import env_dump
from end2end.results.store import mark, rollback
from end2end.spec.config_file import RunSpec, interleave, load_runs
from end2end.sweep.commands import (deepspeed_command, hostfile_text, shell_join,
                                    torchrun_node_command)
from end2end.sweep.options import add_quiet_options, add_sweep_options
from end2end.sweep.lock import SweepLock
from end2end.sweep.outcome import (check_timeout, last_line, log_path, not_ok, pending, rows_for,
                                   run_interruptible, settle_row, signal_name)
from end2end.sweep.procs import GroupOutcome, run_group, signal_death
from end2end.sweep.progress import Progress, format_duration
from end2end.sweep.quiet import Watch, record_verdict, wait_until_quiet
from end2end.sweep.slurm import run_slurm_job, sbatch_script

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "multi_node_fig8.cfg"
# -tt: the remote torchrun gets SIGHUP (which it handles like SIGTERM: it stops its ranks) when
# the launcher stops the local ssh; BatchMode: fail at once instead of asking for a password
SSH = ("ssh", "-tt", "-o", "BatchMode=yes")
DEEPSPEED = (sys.executable, "-m", "deepspeed.launcher.runner")  # `deepspeed` of this Python
log = get_logger("end2end.multi_node")  # status lines (end2end.cli, "Logging")


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
                 device: str = "cuda", join_timeout: Optional[int] = None,
                 remote_torchrun: Sequence[str] = ("torchrun",)) -> List[List[str]]:
    """The command lines of one run: one per node (torchrun, prefixed with ssh unless the host
    is this machine) or one (DeepSpeed's launcher)."""
    nnodes = spec.n // gpus_per_node
    used = list(hosts[:nnodes])
    extra = ["--device", device]
    if launcher == "deepspeed":
        if len(used) > 1 and sum(map(is_local, used)) > 1:
            raise ConfigError(
                f"{spec.label}: DeepSpeed's launcher cannot run {len(used)} nodes on this one "
                "machine (its hostfile names each host once)",
                hint="give one localhost node with all its ranks (--gpus-per-node), or use "
                     "--launcher torchrun for several local nodes")
        return [deepspeed_command(spec, results, hostfile, nnodes, gpus_per_node, used[0],
                                  port, extra, DEEPSPEED, ssh_check=not all(map(is_local, used)))]
    job = "fig8-" + "-".join(part.replace("/", "_") for part in (spec.mode, spec.model,
                                                                  str(spec.n)))
    shared = sum(map(is_local, used)) > 1  # several nodes on this machine: say who hosts
    cmds = []
    for i, host in enumerate(used):
        if is_local(host):
            cmds.append(torchrun_node_command(
                spec, results, nnodes, gpus_per_node, used[0], port, job, extra,
                torchrun=(sys.executable, "-m", "torch.distributed.run"),
                is_host=(i == 0) if shared else None, join_timeout=join_timeout))
        else:
            node_cmd = torchrun_node_command(spec, results, nnodes, gpus_per_node, used[0],
                                             port, job, extra, torchrun=tuple(remote_torchrun),
                                             join_timeout=join_timeout)
            cmds.append([*SSH, host, f"cd {shell_join([workdir])} && exec {shell_join(node_cmd)}"])
    return cmds


def _node(hosts: Sequence[str], i: int) -> str:
    return f"node {i} ({hosts[i]})"


def _node_reason(hosts: Sequence[str], i: int, rc: int, log: Path, running: str) -> str:
    """Why node ``i`` failed, from its exit status and its log (``running``: the nodes that
    were still running, i.e. may never have joined)."""
    if rc < 0:
        return f"{_node(hosts, i)}: its node command was killed by {signal_name(-rc)} (log: {log})"
    killed = signal_death(log)
    if killed:
        return f"{_node(hosts, i)}: {killed} (exit code {rc}; log: {log})"
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    if "EADDRINUSE" in text:
        return (f"{_node(hosts, i)}: the rendezvous port is in use on {hosts[i]} (another job "
                f"or process holds it): pass a free one with --port (exit code {rc}; log: {log})")
    if "RendezvousTimeoutError" in text:
        return (f"{_node(hosts, i)}: rendezvous timeout: not every node joined (still "
                f"running: {running}; exit code {rc}; log: {log})")
    return f"{_node(hosts, i)}: exit code {rc}: {last_line(log)} (log: {log})"


def failure_reason(group: GroupOutcome, hosts: Sequence[str], logs: Sequence[Path],
                   timeout: float) -> Tuple[str, bool]:
    """The error of a job's row, naming the node and what happened (a start failure, the
    timeout, a signal, an exit code, a rendezvous timeout), and whether whatever rows the
    survivors wrote must be replaced (the job was stopped, or a node died of a signal)."""
    if group.start_errors:
        i, why = next(iter(group.start_errors.items()))
        return f"{_node(hosts, i)} did not start: {why}", True
    running = ", ".join(_node(hosts, i) for i in group.stopped) or "none"
    if group.timed_out:
        return (f"timed out after {format_duration(timeout)}; still running: {running} "
                f"(logs: {logs[0].parent})"), True
    killed = [i for i in group.failed if group.codes[i] < 0 or signal_death(logs[i])]
    for i in killed + [i for i in group.failed if i not in killed]:
        return _node_reason(hosts, i, group.codes[i], logs[i], running), bool(killed)
    return f"every node exited 0 but no row was written (logs: {logs[0].parent})", False


def run_job(spec: RunSpec, cmds: Sequence[Sequence[str]], hosts: Sequence[str], out: Path,
            timeout: float, env: dict) -> Tuple[str, str]:
    """Run one job (its node commands together) and make sure it ends as one row; returns the
    row's status and a note for the progress line. Logs: ``<results>.logs/<run>.node<i>.log``.
    This machine is watched over the job (:mod:`end2end.sweep.quiet`: its verdict goes into the
    row's ``Machine`` cell; the note says when it was busy). Ctrl-C stops every node and cuts
    the job's rows (it is pending again), then propagates."""
    logs = [log_path(out, spec, f".node{i}") for i in range(len(cmds))]
    before, start = rows_for(out, spec), mark(out)
    try:
        with Watch() as watch:
            group = run_group(cmds, logs, timeout)
    except BaseException:
        rollback(out, start)
        raise
    reason, replace = failure_reason(group, hosts, logs, timeout)
    status = settle_row(out, spec, before, start, replace, group.timed_out, reason, env)
    return status, record_verdict(out, start, watch.verdict)


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m end2end.multi_node.launch`` command line (every option documented)."""
    p = argparse.ArgumentParser(
        prog="python -m end2end.multi_node.launch", formatter_class=HelpFormatter,
        description="Launch the Figure 8 multi-node runs: print the commands of the pending "
                    "runs (a '#' line names each run) and run them, one row per run, "
                    "resumably: start it again to continue.",
        epilog="Exit status: 0 every run has an ok row; 1 some run is not ok (fail/timeout, "
               "the row names the node and what happened); 2 usage, config or hostfile error "
               "(one line on stderr; also: another sweep holds the results file); 130 "
               "interrupted (Ctrl-C or SIGTERM: every node command is stopped, nothing of the "
               "run is kept, and the same command resumes).")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="config file")
    add_sweep_options(p, "results/fig8.tsv", "shared with the first host; logs in FILE.logs/, "
                      "one per node, and the lock FILE.lock go next to it")
    p.add_argument("--hosts", help="comma-separated host names (first = master); "
                                   "localhost/127.0.0.1 run here without ssh")
    p.add_argument("--hostfile", help="DeepSpeed-style hostfile ('host slots=N' lines)")
    p.add_argument("--gpus-per-node", type=number(int, minimum=1), default=8,
                   help="GPUs (ranks) per node")
    p.add_argument("--launcher", choices=("torchrun", "deepspeed", "slurm"), default="torchrun",
                   help="torchrun on every node, DeepSpeed's launcher on the first, or one "
                        "sbatch job per run (srun: one torchrun agent per allocated node)")
    p.add_argument("--slurm-nodes", type=number(int, minimum=1), default=8,
                   help="slurm: the most nodes a job may ask for (runs that need more are "
                        "left out); --hosts/--hostfile are not needed")
    p.add_argument("--partition", help="slurm: the partition to submit to (default: the "
                                       "cluster's default partition)")
    p.add_argument("--port", type=number(int, minimum=1), default=29500,
                   help="rendezvous port on the first host")
    p.add_argument("--workdir", default=str(Path.cwd()), help="repository root on nodes")
    p.add_argument("--torchrun", default="torchrun",
                   help="the torchrun command on remote nodes (over ssh), e.g. "
                        "'/shared/venv/bin/python -m torch.distributed.run'")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="the driver's device (cpu: gloo ranks, e.g. local test nodes)")
    p.add_argument("--only-n", type=int, nargs="*",
                   help="only these GPU counts (default: every count the hosts can hold)")
    p.add_argument("--join-timeout", type=number(int, minimum=1), default=600,
                   help="torchrun: seconds the agents wait for every node to join the "
                        "rendezvous; then the run fails with a row saying so")
    add_quiet_options(p, " (this one: the launcher's; slurm jobs are not watched)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status (see ``--help``'s epilog)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    return run_interruptible("end2end.multi_node.launch", argv, lambda: _launch(args),
                             args.debug)


def _runs(args: argparse.Namespace, hosts: Sequence[str]) -> List[RunSpec]:
    capacity = len(hosts) * args.gpus_per_node
    runs = [r for r in load_runs(args.config, max_devices=capacity)
            if r.n <= capacity and r.n % args.gpus_per_node == 0
            and (not args.only_n or r.n in args.only_n)]
    return interleave(runs, args.repeat)


def _hostfile(args: argparse.Namespace, hosts: Sequence[str]) -> str:
    """The hostfile DeepSpeed's launcher reads (written next to the results unless given)."""
    hostfile = args.hostfile or str(Path(args.results).with_suffix(".hostfile"))
    if args.launcher == "deepspeed" and not args.hostfile:
        text = hostfile_text(hosts, args.gpus_per_node)
        if args.dry_run:
            print(f"# hostfile {hostfile}:\n" + "".join("#   " + ln + "\n"
                                                      for ln in text.splitlines()), end="")
        else:
            Path(hostfile).parent.mkdir(parents=True, exist_ok=True)
            Path(hostfile).write_text(text)
    return hostfile


def _launch(args: argparse.Namespace) -> int:
    if args.require_quiet and args.launcher == "slurm":
        raise ConfigError("--require-quiet cannot watch the nodes of a slurm job (it watches "
                          "this machine)", hint="drop --require-quiet, or launch with "
                          "--launcher torchrun from the node that runs the job")
    hosts = (["slurm"] * args.slurm_nodes if args.launcher == "slurm"
             else read_hosts(args.hosts, args.hostfile))
    runs, out = _runs(args, hosts), Path(args.results)
    timeout = check_timeout(args.timeout)
    if args.dry_run:
        return _run_all(args, hosts, out, timeout, pending(runs, out, args.retry_failed,
                                                                  None))
    with SweepLock(out, wait=args.wait, on_wait=lambda owner: log.info(
            "%s is in use by %s; waiting (--wait)", out, owner)):
        todo = pending(runs, out, args.retry_failed, None)
        log.info("%s: %d runs, %d already in %s, %d to run", args.config, len(runs),
                 len(runs) - len(todo), out, len(todo))
        _run_all(args, hosts, out, timeout, todo)
        bad = not_ok(runs, out)
    if bad:
        log.info("%d of %d runs not ok: %s", sum(bad.values()), len(runs),
                 ", ".join(f"{n} {status}" for status, n in sorted(bad.items())))
    return 1 if bad else 0


def _slurm(args: argparse.Namespace, spec: RunSpec, out: Path, timeout: float,
           env: dict) -> Callable[[], str]:
    """Print the run's sbatch script (``--dry-run``), or write it and return how to run it."""
    script = log_path(out, spec).with_suffix(".sbatch")
    text = sbatch_script(spec, spec.n // args.gpus_per_node, args.gpus_per_node, str(out),
                         args.workdir, timeout, args.port, ["--device", args.device],
                         str(script.with_suffix(".out").resolve()), args.partition,
                         gpus=args.device == "cuda")
    print(f"# {spec.label} (tp, pp, dp) = {spec.parallel_sizes}: sbatch script {script}",
          flush=True)
    if args.dry_run:
        print(text, end="", flush=True)
        return lambda: "dry-run"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(text)
    print(f"sbatch --parsable --wait {script}", flush=True)
    return lambda: run_slurm_job(spec, script, out, env)


def _run_all(args: argparse.Namespace, hosts: Sequence[str], out: Path, timeout: float,
             todo: Sequence[RunSpec]) -> int:
    """Print the commands of every pending run and (unless ``--dry-run``) run them."""
    hostfile = _hostfile(args, hosts)
    # the output is a script: '#' lines say what follows, the other lines are the commands
    print(f"# {len(todo)} run(s) for {len(hosts)} node(s) x {args.gpus_per_node} GPUs",
          flush=True)
    env = {} if args.dry_run else env_dump(args.device)
    progress = None if args.dry_run else Progress(len(todo))
    for spec in todo:
        if args.launcher == "slurm":
            status = _slurm(args, spec, out, timeout, env)
            if progress is not None:
                progress.start(spec.label)
                progress.finish(status())
            continue
        cmds = commands_for(spec, hosts, args.gpus_per_node, args.launcher, args.results,
                            hostfile, args.port, args.workdir, args.device,
                            args.join_timeout if args.launcher == "torchrun" else None,
                            shlex.split(args.torchrun))
        print(f"# {spec.label} (tp, pp, dp) = {spec.parallel_sizes}", flush=True)
        for cmd in cmds:
            print(shell_join(cmd), flush=True)
        if progress is not None:
            if args.require_quiet:
                wait_until_quiet(args.quiet_wait, log.info)
            progress.start(spec.label)
            progress.finish(*run_job(spec, cmds, hosts, out, timeout, env))
    if progress is not None:
        progress.summary()
    return 0
