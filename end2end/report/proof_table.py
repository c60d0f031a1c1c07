"""The report block ``proof MEASURED SIMULATED``: the simulator's CPU proof (issue 25, item 5) in
the docs, from two committed results files only (no clock, no machine).

``MEASURED`` holds the measured rows of a CPU config (e.g. ``docs/results/cpu.tsv``) and
``SIMULATED`` the simulated rows of the same config (``python -m end2end.simulate.proof CONFIG
--measured MEASURED --out DIR`` writes ``DIR/simulated.tsv`` and ``DIR/simulated.cmd``). The
block gives where each file comes from (time span, machine, commit, rows, the command of its
``.cmd`` file when there is one), the per-run table (predicted vs measured memory per rank and
samples/s, with errors), the summary statistics against the issue's goals and every
Slapo/baseline pair's direction (:mod:`end2end.simulate.proof` computes them all).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

from end2end.results.store import read_results

from .blocks import ReportError
from .registry import generator

__all__ = ["proof_block", "file_provenance"]


def file_provenance(root: Path, path: Path, what: str) -> str:
    """One line: ``what`` (e.g. "Measured"), the rows' UTC span, machine, commit(s), the profile
    of simulated rows, the row count, the file and its command (``.cmd`` beside it, if any)."""
    res = read_results(path, strict=True)
    if not res.rows:
        raise ReportError(f"results file {path.name} has no rows", hint="re-run its command")
    times = sorted(r.time for r in res.rows if r.time)
    span = f"{times[0][:10]} {times[0][11:16]}-{times[-1][11:16]} UTC" if times else "undated"
    commits = sorted({r.git_commit for r in res.rows if r.git_commit}
                     or {res.env.get("git_commit", "unknown")})
    env = res.env
    cores = env.get("cpu_affinity") or env.get("cpu_count") or "?"
    profile = f" with the profile '{env['profile']}'" if env.get("profile") else ""
    command = path.with_suffix(".cmd")
    lines = command.read_text().splitlines() if command.is_file() else []
    commands = [_one_line(c) for c in lines if c.strip()]
    made = (", made by " + ", then ".join(f"`{c}`" for c in commands)) if commands else ""
    rel = path.relative_to(root)
    return (f"{what} {span} on {env.get('cpu_model', 'an unrecorded machine')} ({cores} cores)"
            f"{profile}, commit {', '.join(commits)}; {len(res.rows)} rows in [`{rel}`](/{rel})"
            f"{made}.")


def _one_line(command: str) -> str:
    """A ``.cmd`` line with its whitespace normalised as the shell reads it; a line the shell
    would not split (a comment with an apostrophe) as it is written."""
    try:
        return " ".join(shlex.split(command))
    except ValueError:
        return " ".join(command.split())


def _existing(root: Path, name: str) -> Path:
    path = root / name
    if not path.is_file():
        raise ReportError(f"results file {name} does not exist",
                          hint="commit it under docs/results/, or fix the path")
    return path


@generator("proof")
def proof_block(root: Path, args: Sequence[str]) -> str:
    """The block's Markdown (module docstring)."""
    from end2end.simulate.proof import compare, pairs, summarise, tables

    if len(args) != 2:
        raise ReportError(f"'proof' needs a measured and a simulated results file, got "
                          f"{list(args)}", hint="e.g. <!-- report: proof docs/results/cpu.tsv "
                          "docs/results/cpu_proof/simulated.tsv -->")
    measured, simulated = (_existing(root, a) for a in args)
    both = compare(measured, simulated)
    if both.empty:
        raise ReportError(f"no run of {args[0]} has both a measured ok row and a simulated row "
                          f"in {args[1]}", hint="simulate the same config's lines")
    return "\n".join([file_provenance(root, measured, "Measured"), "",
                      file_provenance(root, simulated, "Simulated"), "",
                      tables(both, summarise(both), pairs(both))]).rstrip("\n")
