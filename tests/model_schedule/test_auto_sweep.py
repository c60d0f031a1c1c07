"""The "auto" schedule on EVERY causal-LM family of ``transformers.CONFIG_MAPPING`` that declares
a tensor-parallel plan, at TP 2 on gloo: each family ends ``ok`` (trains like the unscheduled
model, ``test_auto_families.check_auto``), ``refused`` (a ``ConfigError`` naming the plan entry
and why) or ``wrong`` / ``broken`` (anything else: a mismatch, or an unexpected exception).

Bounded and resumable: every family runs in a fresh worker process (which spawns its 2 ranks),
under a time limit and a per-process memory limit (``RLIMIT_DATA``), so one family's crash or
memory blow-up ends as that family's ``broken`` row and the sweep goes on. Each row is appended
to a TSV (``family``, ``status``, ``reason``) as soon as it is known; a rerun skips the families
already in the file (``--fresh`` starts over).

Slow (tens of minutes): runs with ``SLAPO_SLOW_TESTS=1``, or as a script::

    .venv/bin/python -m tests.model_schedule.test_auto_sweep [--out auto_sweep.tsv]
        [--timeout 300] [--memory-gb 3] [--jobs 1] [--fresh] [family ...]
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

WORKER_TAG = "SWEEP-RESULT\t"


def plan_families() -> List[str]:
    """Every ``model_type`` with a causal-LM class whose config class carries a plan."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return [m for m in sorted(CONFIG_MAPPING.keys()) if m in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and getattr(CONFIG_MAPPING[m], "base_model_tp_plan", None)]


def verdict(result: str) -> str:
    """``ok`` / ``refused`` (a ConfigError) / ``wrong`` (a numerical mismatch) / ``broken``."""
    if result == "ok":
        return "ok"
    if result.startswith("ConfigError"):
        return "refused"
    if result.startswith("AssertionError"):
        return "wrong"
    return "broken"


def _one_line(text: str, limit: int = 400) -> str:
    return " ".join(text.split())[:limit]


# ------------------------------------------------------------------ the worker (one family)
def _worker(family: str, world_size: int, timeout: float) -> int:
    """Run one family on ``world_size`` fresh ranks and print its tagged result line."""
    from slapo.testing import run_distributed
    from slapo.testing.distributed import RankFailure
    from tests.model_schedule.test_auto_families import check_families

    try:
        result = run_distributed(check_families, world_size, [family], timeout=timeout)[0][family]
    except RankFailure as e:  # a rank died outside check_auto (killed, out of memory...)
        result = f"RankFailure: {e.remote_traceback.strip().splitlines()[-1]}"
    print(WORKER_TAG + result.replace("\n", " "), flush=True)
    return 0


def _limit_memory(gigabytes: float) -> None:
    limit = int(gigabytes * (1 << 30))
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def run_family(family: str, *, world_size: int = 2, timeout: float = 300.0,
               memory_gb: float = 3.0) -> Tuple[str, str]:
    """``(status, reason)`` of one family, from a fresh worker process (and its ranks) limited
    to ``timeout`` seconds and ``memory_gb`` of data per process."""
    cmd = [sys.executable, "-m", "tests.model_schedule.test_auto_sweep", "--worker", family,
           "--world-size", str(world_size), "--timeout", str(timeout)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: _limit_memory(memory_gb))
    try:
        out, err = proc.communicate(timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "broken", f"timeout: no result within {timeout + 60:.0f}s (killed)"
    lines = [ln[len(WORKER_TAG):] for ln in out.splitlines() if ln.startswith(WORKER_TAG)]
    if not lines:
        tail = _one_line(err.strip().splitlines()[-1] if err.strip() else "no output")
        return "broken", f"worker exited with code {proc.returncode}: {tail}"
    result = lines[-1]
    status = verdict(result)
    return status, "" if status == "ok" else _one_line(result)


# ------------------------------------------------------------------ the sweep (resumable TSV)
def read_table(path: str) -> Dict[str, Tuple[str, str]]:
    """family -> (status, reason) from a sweep TSV (empty when the file does not exist)."""
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as f:
        return {row[0]: (row[1], row[2] if len(row) > 2 else "")
                for row in csv.reader(f, delimiter="\t") if len(row) >= 2}


def sweep(families: Sequence[str], out: str, *, fresh: bool = False, progress: bool = False,
          jobs: int = 1, **limits) -> Dict[str, Tuple[str, str]]:
    """Run every family not yet in ``out`` (all with ``fresh``), ``jobs`` workers at a time,
    appending one TSV row each as it ends; returns family -> (status, reason) for
    ``families``."""
    if fresh and os.path.exists(out):
        os.remove(out)
    done = read_table(out)
    lock = threading.Lock()

    def one(family: str) -> None:
        row = run_family(family, **limits)
        with lock:
            done[family] = row
            with open(out, "a", newline="") as f:
                csv.writer(f, delimiter="\t", lineterminator="\n").writerow([family, *row])
            if progress:
                print(f"{family}\t{row[0]}\t{row[1][:200]}", flush=True)

    todo = [f for f in families if f not in done]
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(one, todo))
    return {f: done[f] for f in families}


def counts(table: Dict[str, Tuple[str, str]]) -> Dict[str, int]:
    """status -> number of families."""
    out: Dict[str, int] = {}
    for status, _ in table.values():
        out[status] = out.get(status, 0) + 1
    return out


def markdown(table: Dict[str, Tuple[str, str]], families: Sequence[str]) -> str:
    """The docs' table of a sweep TSV: counts per status, then one row per family of
    ``families`` (``not run`` where the TSV has none yet)."""
    rows = {f: table.get(f, ("not run", "")) for f in families}
    total = counts(rows)
    lines = [", ".join(f"{k}: {v}" for k, v in sorted(total.items())) + f" (of {len(rows)})",
             "", "| family | status | reason |", "|---|---|---|"]
    for family, (status, reason) in rows.items():
        reason = reason.replace("|", "\\|")
        lines.append(f"| {family} | {status} | {reason[:240]} |")
    return "\n".join(lines)


@pytest.mark.skipif(os.environ.get("SLAPO_SLOW_TESTS") != "1",
                    reason="slow: set SLAPO_SLOW_TESTS=1")
def test_every_family_with_a_plan_is_ok_or_refused(tmp_path):
    table = sweep(plan_families(), str(tmp_path / "sweep.tsv"))
    bad = {f: r for f, r in table.items() if r[0] not in ("ok", "refused")}
    assert not bad, bad


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("families", nargs="*", help="model_types (default: every family with a plan)")
    ap.add_argument("--out", default="auto_sweep.tsv", help="the TSV (appended to, resumed)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per family")
    ap.add_argument("--memory-gb", type=float, default=3.0, help="data limit per process")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=1, help="families run at the same time")
    ap.add_argument("--fresh", action="store_true", help="start over (delete --out first)")
    ap.add_argument("--markdown", action="store_true", help="print --out as the docs' table")
    ap.add_argument("--worker", metavar="FAMILY", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown(read_table(args.out), args.families or plan_families()))
        return 0
    if args.worker:
        return _worker(args.worker, args.world_size, args.timeout)
    table = sweep(args.families or plan_families(), args.out, fresh=args.fresh, progress=True,
                  jobs=args.jobs, world_size=args.world_size, timeout=args.timeout,
                  memory_gb=args.memory_gb)
    print("\t".join(f"{k}={v}" for k, v in sorted(counts(table).items())))
    return 0 if all(s in ("ok", "refused") for s, _ in table.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
