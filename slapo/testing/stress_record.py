"""The record of the clean-exit stress runs (:mod:`slapo.testing.stress_exit` ``--record``).

Fifty runs of each of fifteen scripts take about 3.5 hours on a 2-core machine, longer than one
working session, so the long run accumulates: every run appends one JSON line to the record
(when, the commit and the tree of ``slapo/`` it ran, the script's name and the digest of its
text, the exit code, the seconds), ``--until N`` runs each script until the record holds N runs
of its *current* text, and ``--summary`` reads the record back per script with the commits its
runs span. A run of a script whose text has changed since no longer counts; a change of the
library between sittings is shown (the ``slapo/`` trees), not hidden.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import pathlib
import subprocess
from typing import Dict, List, Mapping

__all__ = ["script_digest", "code_state", "append_run", "ScriptRuns", "read_runs",
           "summary_lines"]


def script_digest(source: str) -> str:
    """A short digest of a script's text (what a record's run ran)."""
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def _git(root: pathlib.Path, *args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def code_state(root: pathlib.Path) -> Dict[str, str]:
    """The commit of ``root`` (``-dirty`` when ``slapo/`` has uncommitted changes) and the git
    tree of its ``slapo/`` folder ("" outside a git checkout)."""
    commit = _git(root, "rev-parse", "--short=12", "HEAD")
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no", "--", "slapo")
    return {"commit": commit + ("-dirty" if commit and dirty else ""),
            "slapo_tree": _git(root, "rev-parse", "--short=12", "HEAD:slapo")}


def append_run(path: pathlib.Path, name: str, source: str, rc: int, seconds: float,
               state: Mapping[str, str]) -> None:
    """Append one run to the record at ``path`` (created with its folder when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = dict(time=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                **state, script=name, script_sha=script_digest(source), rc=rc,
                seconds=round(seconds, 1))
    with path.open("a") as f:
        f.write(json.dumps(line) + "\n")


@dataclasses.dataclass
class ScriptRuns:
    """The recorded runs of one script's current text."""

    runs: int = 0
    failed: List[int] = dataclasses.field(default_factory=list)  # non-zero exit codes
    commits: List[str] = dataclasses.field(default_factory=list)  # in first-seen order
    slapo_trees: List[str] = dataclasses.field(default_factory=list)


def read_runs(path: pathlib.Path, scripts: Mapping[str, str]) -> Dict[str, ScriptRuns]:
    """Per script of ``scripts`` (name -> current text): the runs of ``path`` that ran that text
    (none when the record does not exist)."""
    found = {name: ScriptRuns() for name in scripts}
    digests = {name: script_digest(source) for name, source in scripts.items()}
    if not path.exists():
        return found
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            run = json.loads(line)
            name, sha, rc = run["script"], run["script_sha"], int(run["rc"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a stress run record ({exc})") from None
        if name not in found or sha != digests[name]:
            continue
        entry = found[name]
        entry.runs += 1
        if rc != 0:
            entry.failed.append(rc)
        for key, seen in (("commit", entry.commits), ("slapo_tree", entry.slapo_trees)):
            if run.get(key) and run[key] not in seen:
                seen.append(run[key])
    return found


def summary_lines(found: Mapping[str, ScriptRuns]) -> List[str]:
    """One line per script: runs of its current text, non-zero exits, commits spanned."""
    lines = []
    for name, entry in found.items():
        bad = f" (exit codes {entry.failed})" if entry.failed else ""
        trees = len(entry.slapo_trees)
        span = (f"; commits {', '.join(entry.commits)}; {trees} slapo/ tree(s)"
                if entry.commits else "")
        lines.append(f"  {name}: {len(entry.failed)} non-zero of {entry.runs}{bad}{span}")
    return lines
