"""Run the 2-rank docs examples and each runtime's smallest training script many times, as a user
would (``torchrun --standalone --nproc_per_node 2 script.py``, no ``os._exit``), and count the
runs that did not exit 0.

A finished run used to abort at interpreter exit now and then (``terminate called without an
active exception``; :mod:`slapo.runtime.lifecycle` explains why); this is the check that it no
longer does::

    python -m slapo.testing.stress_exit --runs 50          # 50 of each (about 3.5 hours)
    python -m slapo.testing.stress_exit --runs 2 --only torch_tp docs/tensor_parallel.md#1
    python -m slapo.testing.stress_exit --list
    # the long run across sittings: each script until the record holds 50 runs of its text
    python -m slapo.testing.stress_exit --record docs/results/stress_exit.jsonl --until 50
    python -m slapo.testing.stress_exit --record docs/results/stress_exit.jsonl --summary

The docs examples are the ```` ```python ranks=2 ```` blocks of README.md and docs/*.md, read
from the checkout at run time (so the text run is the text shown); the runtime scripts are the
files of ``slapo/testing/exit_scripts/`` (one per runtime, ``verify`` and the tuner's trial
processes). ``--record FILE`` appends every run to a record (:mod:`slapo.testing.stress_record`);
``--until N`` then runs each script only until the record holds N runs of its current text, and
``--summary`` reads the record back. Exit status 1 when any run (or, with ``--summary``, any
recorded run of a current text) failed.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

from ..errors import ConfigError
from . import stress_record

__all__ = ["examples", "run_once", "stress", "main", "SCRIPTS_DIR", "REPO_ROOT", "PLAIN_PYTHON"]

SCRIPTS_DIR = pathlib.Path(__file__).resolve().parent / "exit_scripts"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"^```python ranks=2[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
# A script whose first line is this runs under plain Python (it launches its own ranks, as the
# tuner's trials do); every other script runs under torchrun on 2 ranks.
PLAIN_PYTHON = "# launch: python\n"


def docs_examples(root: pathlib.Path = REPO_ROOT) -> Dict[str, str]:
    """``{"docs/page.md#K": source}`` for every 2-rank block of README.md and docs/*.md (the
    K-th such block of the page, counted from 1: stable while the text around it changes)."""
    found: Dict[str, str] = {}
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        if not page.is_file():
            continue
        text = page.read_text()
        for k, m in enumerate(_BLOCK.finditer(text), start=1):
            found[f"{page.relative_to(root)}#{k}"] = m.group(1)
    return found


def examples(root: pathlib.Path = REPO_ROOT) -> Dict[str, str]:
    """Every script the stress test runs: the docs' 2-rank examples, then the runtime scripts
    (named by file stem)."""
    found = docs_examples(root)
    for path in sorted(SCRIPTS_DIR.glob("*.py")):
        found[path.stem] = path.read_text()
    return found


def run_once(source: str, timeout_s: float = 300.0) -> tuple:
    """Run ``source`` under torchrun on 2 ranks (under plain Python if it starts with
    :data:`PLAIN_PYTHON`) in a fresh directory; ``(exit code, output)``. A run that outlives
    ``timeout_s`` is killed (its whole process group) and counts as 124."""
    with tempfile.TemporaryDirectory(prefix="slapo-exit-") as tmp:
        script = pathlib.Path(tmp, "train.py")
        script.write_text(source)
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                   PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, str(script)] if source.startswith(PLAIN_PYTHON) else [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            "2", str(script)]
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return 124, out
        return proc.returncode, out


OnRun = Callable[[str, str, int, float], None]


def stress(names: Sequence[str], runs: Union[int, Mapping[str, int]], timeout_s: float = 300.0,
           log=print, on_run: Optional[OnRun] = None) -> Dict[str, List[int]]:
    """Run each of ``names`` (keys of :func:`examples`) ``runs`` times (or ``runs[name]``
    times), interleaved; return every run's exit code per name. A failed run's output tail goes
    to ``log``; ``on_run(name, source, rc, seconds)`` is called after every run.

    Raises:
        ConfigError: an unknown name, or ``runs`` < 1.
    """
    scripts = examples()
    unknown = [n for n in names if n not in scripts]
    wanted = {n: runs if isinstance(runs, int) else runs.get(n, 0) for n in names}
    if unknown or (isinstance(runs, int) and runs < 1):
        raise ConfigError(f"unknown script(s) {unknown}" if unknown else f"runs={runs} < 1",
                          call="stress_exit", hint=f"choose from {sorted(scripts)} "
                          "(--list) and --runs >= 1")
    codes: Dict[str, List[int]] = {n: [] for n in names}
    for i in range(max(wanted.values(), default=0)):
        for name in (n for n in names if wanted[n] > i):
            start = time.monotonic()
            rc, out = run_once(scripts[name], timeout_s)
            seconds = time.monotonic() - start
            codes[name].append(rc)
            log(f"run {i + 1}/{wanted[name]} {name}: exit {rc} ({seconds:.0f} s)")
            if rc != 0:
                log(out[-3000:])
            if on_run is not None:
                on_run(name, scripts[name], rc, seconds)
    return codes


def _recorded(path: pathlib.Path, names: Sequence[str]) -> Dict[str, stress_record.ScriptRuns]:
    scripts = examples()
    try:
        return stress_record.read_runs(path, {n: scripts[n] for n in names if n in scripts})
    except ValueError as err:
        raise ConfigError(str(err), call="stress_exit --record",
                          hint="give a record written by --record (one JSON run per line)") \
            from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m slapo.testing.stress_exit",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs of each script (default 1)")
    parser.add_argument("--only", nargs="+", help="script names (default: all; see --list)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--list", action="store_true", help="print the script names and exit")
    parser.add_argument("--record", type=pathlib.Path,
                        help="append every run to this record (JSON lines)")
    parser.add_argument("--until", type=int, help="with --record: run each script until the "
                        "record holds this many runs of its current text (instead of --runs)")
    parser.add_argument("--summary", action="store_true",
                        help="with --record: print the recorded runs per script and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(examples()))
        return 0
    if (args.until is not None or args.summary) and args.record is None:
        parser.error("--until and --summary read the record: give --record FILE")
    names = args.only or list(examples())
    try:
        if args.summary:
            found = _recorded(args.record, names)
            print(f"{args.record}: non-zero exits of the recorded runs of each script's text")
            print("\n".join(stress_record.summary_lines(found)))
            return 1 if any(e.failed for e in found.values()) else 0
        runs: Union[int, Dict[str, int]] = args.runs
        if args.until is not None:
            runs = {n: max(0, args.until - e.runs)
                    for n, e in _recorded(args.record, names).items()}
            print(f"to run until {args.until} each: {runs}", flush=True)
        on_run = None
        if args.record is not None:
            state = stress_record.code_state(REPO_ROOT)
            record = args.record

            def on_run(name: str, source: str, rc: int, seconds: float) -> None:
                stress_record.append_run(record, name, source, rc, seconds, state)
        codes = stress(names, runs, args.timeout, on_run=on_run)
    except ConfigError as err:
        parser.error(str(err))
    print("\nscript: non-zero exits of runs")
    for name, rcs in codes.items():
        bad = [rc for rc in rcs if rc != 0]
        print(f"  {name}: {len(bad)} of {len(rcs)}" + (f" (exit codes {bad})" if bad else ""))
    return 1 if any(rc != 0 for rcs in codes.values() for rc in rcs) else 0


if __name__ == "__main__":
    sys.exit(main())
