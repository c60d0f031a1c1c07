"""Run the steps of a plan (:mod:`end2end.reproduce.plan`) into an output folder, resumably.

Each step runs its commands from the repository root with its output under ``DIR/<step>/`` and
everything they print in ``DIR/<step>/log.txt``. A step that finishes writes
``DIR/.reproduce/<step>.json`` (status, seconds, when, the commands); a later run skips the
steps recorded ``ok`` and runs the others again (the sweeps inside them resume by their results
files, so a step cut short loses only its current run). One progress line per step says where
the plan is and about how long is left: the remaining steps' estimates scaled by the pace of the
steps this run has finished (damped by :data:`PACE_PRIOR_S` of estimate taken at face value,
so a step of a few seconds does not rescale hours).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Sequence, TextIO

from slapo.errors import ConfigError

from end2end.reproduce.plan import Step
from end2end.sweep.progress import format_duration

__all__ = ["ROOT", "Outcome", "load_outcomes", "claim_folder", "commands_of", "env_of",
           "run_plan", "estimate_left", "PACE_PRIOR_S"]

#: Seconds of estimate counted as run exactly on time before any step has finished: the pace
#: of the steps done (measured / estimated) moves the estimate of what is left only once they
#: add up to a comparable time (a 1 s step that was estimated at 15 s must not turn 1h40m
#: into 9 minutes).
PACE_PRIOR_S = 600.0

ROOT = Path(__file__).resolve().parents[2]
STATE = ".reproduce"
# the scripts that take the sweeps' options (--require-quiet: autotune/run.sh passes it to
# every measured candidate, the others to python -m end2end.sweep)
SWEEPS = {("end2end/run_all_single_node.sh",), ("ablation/run.sh",), ("autotune/run.sh",)}
# the children run without the set-up (scripts/reproduce.sh did it) and offline
CHILD_ENV = {"SKIP_SETUP": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
             "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class Outcome:
    """How a step ended: ``ok`` or ``failed`` (with ``error``), its seconds and finish time."""

    name: str
    status: str
    seconds: float
    finished: str
    commands: List[str] = field(default_factory=list)
    error: str = ""


def load_outcomes(out: Path) -> Dict[str, Outcome]:
    """The recorded outcome of every step that has one in ``out``."""
    found = {}
    for path in sorted((out / STATE).glob("*.json")):
        try:
            data = json.loads(path.read_text())
            found[data["name"]] = Outcome(**data)
        except (ValueError, KeyError, TypeError):
            continue  # a damaged record: the step runs again
    return found


def claim_folder(out: Path, plan_name: str) -> None:
    """Make ``out`` this plan's folder, or refuse one that holds the other plan's results."""
    marker = out / STATE / "plan"
    if marker.is_file() and marker.read_text().strip() != plan_name:
        other = marker.read_text().strip()
        raise ConfigError(f"{out} holds a --{other} reproduction, not a --{plan_name} one",
                          hint=f"give another --out, or add --{other} to resume that one")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(plan_name + "\n")


def _expand(arg: str, folder: Path, python: str) -> str:
    return arg.replace("{out}", str(folder)).replace("{python}", python)


def commands_of(step: Step, out: Path, python: str = sys.executable,
                sweep_args: Sequence[str] = ()) -> List[List[str]]:
    """The step's commands with ``{out}`` (``out/<step>``) and ``{python}`` filled in;
    ``sweep_args`` go to every command that runs a sweep (e.g. ``--require-quiet``)."""
    folder = out / step.name
    return [[_expand(arg, folder, python) for arg in cmd]
            + (list(sweep_args) if tuple(cmd[1:2]) in SWEEPS else []) for cmd in step.commands]


def env_of(step: Step, out: Path, python: str = sys.executable) -> Dict[str, str]:
    """The step's environment variables with ``{out}`` and ``{python}`` filled in."""
    return {k: _expand(v, out / step.name, python) for k, v in step.env.items()}


def _shell_text(cmd: Sequence[str], env: Dict[str, str]) -> str:
    """The command as one would type it (its environment first, ``> FILE`` kept)."""
    words = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    words += [w if w == ">" else shlex.quote(w) for w in cmd]
    return " ".join(words)


def _run_command(cmd: List[str], env: Dict[str, str], log: TextIO) -> int:
    """Run one command from the repository root; output to ``log`` (or, for ``... > FILE``,
    standard output to FILE). Ctrl-C reaches the command too (same terminal): it is given a
    minute to stop cleanly (the sweeps cut their current run), then the interrupt goes on."""
    stdout: TextIO = log
    if len(cmd) > 2 and cmd[-2] == ">":
        Path(cmd[-1]).parent.mkdir(parents=True, exist_ok=True)
        stdout = open(cmd[-1], "w")
        cmd = cmd[:-2]
    try:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **CHILD_ENV, **env},
                                stdout=stdout, stderr=log, stdin=subprocess.DEVNULL)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    finally:
        if stdout is not log:
            stdout.close()


def _run_step(step: Step, out: Path, python: str, sweep_args: Sequence[str]) -> Outcome:
    folder = out / step.name
    folder.mkdir(parents=True, exist_ok=True)
    env = env_of(step, out, python)
    start = time.monotonic()
    texts, error = [], ""
    with open(folder / "log.txt", "a") as log:
        for cmd in commands_of(step, out, python, sweep_args):
            texts.append(_shell_text(cmd, env))
            print(f"$ {texts[-1]}", file=log, flush=True)
            rc = _run_command(cmd, {"PYTHON": python, **env}, log)
            if rc != 0:
                error = f"`{texts[-1]}` exited {rc} (log: {folder / 'log.txt'})"
                break
    for args in step.blocks:  # the docs/results/ convention: the command beside each file
        if not error and (folder / args[1]).exists():
            (folder / args[1]).with_suffix(".cmd").write_text("\n".join(texts) + "\n")
    outcome = Outcome(step.name, "failed" if error else "ok", round(time.monotonic() - start, 1),
                      time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), texts, error)
    state = out / STATE / f"{step.name}.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps(asdict(outcome), indent=1) + "\n")
    return outcome


def estimate_left(estimates: Sequence[float], estimated: float, measured: float) -> float:
    """Seconds the steps with ``estimates`` will take, scaled by the pace of the steps already
    run (``measured`` seconds for ``estimated`` seconds of estimate), damped by
    :data:`PACE_PRIOR_S`."""
    pace = (measured + PACE_PRIOR_S) / (estimated + PACE_PRIOR_S)
    return pace * sum(estimates)


def run_plan(steps: Sequence[Step], out: Path, python: str = sys.executable,
             stream: TextIO = sys.stdout, dry_run: bool = False,
             sweep_args: Sequence[str] = ()) -> Dict[str, Outcome]:
    """Run every step of ``steps`` that ``out`` has no ``ok`` record of; returns the outcome of
    every step (recorded ones included). ``dry_run``: print the commands, run nothing;
    ``sweep_args``: options for every sweep (:func:`commands_of`)."""
    done = {n: o for n, o in load_outcomes(out).items() if o.status == "ok"}
    todo = [s for s in steps if s.name not in done]
    estimate = {s.name: s.estimate_s for s in todo}
    spent = {"estimated": 0.0, "measured": 0.0}

    def left(after: int) -> float:
        return estimate_left([estimate[s.name] for s in todo[after:]], spent["estimated"],
                             spent["measured"])

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    total = len(steps)
    say(f"reproduce: {total} steps, {len(done)} done already, about "
        f"{format_duration(left(0))} to run (estimates for 2 idle cores) -> {out}")
    outcomes = dict(done)
    for i, step in enumerate(steps, start=1):
        if step.name in done:
            o = done[step.name]
            say(f"[{i}/{total}] {step.name}: done already ({format_duration(o.seconds)}, "
                f"{o.finished}): skipped")
            continue
        position = todo.index(step)
        if dry_run:
            for cmd in commands_of(step, out, python, sweep_args):
                say(f"[{i}/{total}] {step.name}: {_shell_text(cmd, env_of(step, out, python))}")
            continue
        say(f"[{i}/{total}] {step.name}: {step.title} ({step.what}); about "
            f"{format_duration(left(position))} left")
        outcome = _run_step(step, out, python, sweep_args)
        outcomes[step.name] = outcome
        spent["estimated"] += step.estimate_s
        spent["measured"] += outcome.seconds
        detail = f"ok in {format_duration(outcome.seconds)}" if outcome.status == "ok" else \
            f"FAILED after {format_duration(outcome.seconds)}: {outcome.error}"
        say(f"[{i}/{total}] {step.name}: {detail}; about "
            f"{format_duration(left(position + 1))} left")
    return outcomes

