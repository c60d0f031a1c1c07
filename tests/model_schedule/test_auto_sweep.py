"""The "auto" schedule on EVERY model class with a tensor-parallel plan, at TP 2 on gloo: each
family of ``transformers.CONFIG_MAPPING`` whose config (or a sub-config: the text model of a
vision-language model) declares a plan, with each head transformers has for it (causal LM,
masked LM, seq2seq, image-text-to-text run text-only, sequence classification:
``slapo.testing.models.PLAN_HEADS``; rows ``family`` for the causal LM, ``family:head``
otherwise). Each row ends ``ok`` (trains like the unscheduled model on EVERY rank,
``test_auto_families.check_auto``: outputs, all gradients, 3 steps, replicated parameters
identical across ranks, and each rank shards the fraction of parameters the model's own plan
says), ``refused`` (a one-line ``ConfigError`` naming the module and why), ``unapplied`` (a
rank shards less or more than the plan says), ``wrong`` (a numerical mismatch), ``broken``
(anything else) or ``unbuilt`` (the unscheduled tiny model of that class does not build or
train from ``tiny_plan_config``: no verdict on the schedule). The ``sharded`` column gives each
rank's sharded fraction and the plan's.

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


_HEAD_MAPPINGS = {"causal": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
                  "masked": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
                  "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
                  "image_text": "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
                  "seqcls": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"}


def _has_plan(config_cls) -> bool:
    if getattr(config_cls, "base_model_tp_plan", None):
        return True
    return any(isinstance(sub, type) and getattr(sub, "base_model_tp_plan", None)
               for sub in (getattr(config_cls, "sub_configs", None) or {}).values())


def plan_families() -> List[str]:
    """Every model class with a plan: ``family`` (causal LM) or ``family:head``, for each
    ``model_type`` whose config class or a sub-config class carries a plan and each head
    transformers maps it to."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto

    rows = []
    for head, mapping in _HEAD_MAPPINGS.items():
        names = getattr(modeling_auto, mapping)
        rows += [m if head == "causal" else f"{m}:{head}" for m in sorted(CONFIG_MAPPING.keys())
                 if m in names and _has_plan(CONFIG_MAPPING[m])]
    return rows


UNBUILT = "unbuilt"


def verdict(result: str) -> str:
    """``ok`` / ``refused`` (a ConfigError) / ``unapplied`` (a rank does not shard what the plan
    says) / ``wrong`` (a numerical mismatch) / ``broken`` / ``unbuilt`` (the unscheduled tiny
    model itself does not build or train: a limit of ``tiny_plan_config``, no verdict on the
    schedule)."""
    if result == "ok":
        return "ok"
    if result.startswith(UNBUILT):
        return UNBUILT
    if result.startswith("ConfigError"):
        return "refused"
    if result.startswith("AssertionError") and "the plan says" in result:
        return "unapplied"
    if result.startswith("AssertionError"):
        return "wrong"
    return "broken"


def _rank_result(family: str) -> Tuple[str, float, float]:
    """On one rank: ``check_auto``'s result, the fraction of the parameters this rank shards,
    and the fraction the plan says (both 0 when refused or broken)."""
    import warnings

    import torch

    from slapo.testing.models import tiny_plan_model
    from tests.model_schedule import test_auto_families as F

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    model_type, _, head = family.partition(":")
    try:  # the unscheduled tiny model must build and train, or the row says nothing
        ref = tiny_plan_model(model_type, head=head or "causal")
        ref(**F.head_inputs(head or "causal", ref)).loss.backward()
    except Exception as e:  # noqa: BLE001 - reported per family
        return f"{UNBUILT}: {type(e).__name__}: {e}", 0.0, 0.0
    try:
        F.check_auto(family)
        return "ok", *F.LAST_FRACTIONS.get(family, (0.0, 0.0))
    except Exception as e:  # noqa: BLE001 - reported per family
        return f"{type(e).__name__}: {e}", 0.0, 0.0


def combine(per_rank: Sequence[Tuple[str, float, float]]) -> Tuple[str, str]:
    """One row from every rank's result: the first rank that failed decides; ``sharded`` lists
    each rank's sharded fraction and the plan's."""
    bad = [(r, res) for r, (res, _, _) in enumerate(per_rank) if res != "ok"]
    result = bad[0][1] if bad else "ok"
    if bad and len(per_rank) > 1:
        result = f"{result.split(':')[0]}: rank {bad[0][0]}: {result.partition(': ')[2]}"
    sharded = "" if bad else " ".join(f"r{r}={got:.3f}" for r, (_, got, _) in enumerate(
        per_rank)) + f" plan={per_rank[0][2]:.3f}"
    return result, sharded


def _one_line(text: str, limit: int = 400) -> str:
    return " ".join(text.split())[:limit]


# ------------------------------------------------------------------ the worker (one family)
def _worker(family: str, world_size: int, timeout: float) -> int:
    """Run one family on ``world_size`` fresh ranks and print its tagged result line (every
    rank's result combined, :func:`combine`)."""
    from slapo.testing import run_distributed
    from slapo.testing.distributed import RankFailure

    try:
        result, sharded = combine(run_distributed(_rank_result, world_size, family,
                                                  timeout=timeout))
    except RankFailure as e:  # a rank died outside check_auto (killed, out of memory...)
        result, sharded = f"RankFailure: {e.remote_traceback.strip().splitlines()[-1]}", ""
    print(WORKER_TAG + sharded + "\t" + result.replace("\n", " ").replace("\t", " "),
          flush=True)
    return 0


def _limit_memory(gigabytes: float) -> None:
    limit = int(gigabytes * (1 << 30))
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def run_family(family: str, *, world_size: int = 2, timeout: float = 300.0,
               memory_gb: float = 3.0) -> Tuple[str, str, str]:
    """``(status, sharded, reason)`` of one family, from a fresh worker process (and its ranks)
    limited to ``timeout`` seconds and ``memory_gb`` of data per process."""
    cmd = [sys.executable, "-m", "tests.model_schedule.test_auto_sweep", "--worker", family,
           "--world-size", str(world_size), "--timeout", str(timeout)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: _limit_memory(memory_gb))
    try:
        out, err = proc.communicate(timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "broken", "", f"timeout: no result within {timeout + 60:.0f}s (killed)"
    lines = [ln[len(WORKER_TAG):] for ln in out.splitlines() if ln.startswith(WORKER_TAG)]
    if not lines:
        tail = _one_line(err.strip().splitlines()[-1] if err.strip() else "no output")
        return "broken", "", f"worker exited with code {proc.returncode}: {tail}"
    sharded, _, result = lines[-1].partition("\t")
    status = verdict(result)
    return status, sharded, "" if status == "ok" else _one_line(result)


# ------------------------------------------------------------------ the sweep (resumable TSV)
HEADER = ["family", "status", "sharded", "reason"]


def read_table(path: str) -> Dict[str, Tuple[str, str, str]]:
    """family -> (status, sharded, reason) from a sweep TSV (empty when the file does not
    exist)."""
    if not os.path.exists(path):
        return {}
    with open(path, newline="") as f:
        rows = [row + [""] * (4 - len(row)) for row in csv.reader(f, delimiter="\t")
                if len(row) >= 2 and row[0] != HEADER[0]]
    return {row[0]: (row[1], row[2], row[3]) for row in rows}


def sweep(families: Sequence[str], out: str, *, fresh: bool = False, progress: bool = False,
          jobs: int = 1, **limits) -> Dict[str, Tuple[str, str, str]]:
    """Run every family not yet in ``out`` (all with ``fresh``), ``jobs`` workers at a time,
    appending one TSV row each as it ends; returns family -> (status, sharded, reason) for
    ``families``."""
    if fresh and os.path.exists(out):
        os.remove(out)
    done = read_table(out)
    if not os.path.exists(out):
        with open(out, "w", newline="") as f:
            f.write("\t".join(HEADER) + "\n")
    lock = threading.Lock()

    def one(family: str) -> None:
        row = run_family(family, **limits)
        with lock:
            done[family] = row
            with open(out, "a", newline="") as f:
                csv.writer(f, delimiter="\t", lineterminator="\n").writerow([family, *row])
            if progress:
                print(f"{family}\t{row[0]}\t{row[1]}\t{row[2][:200]}", flush=True)

    todo = [f for f in families if f not in done]
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(one, todo))
    return {f: done[f] for f in families}


def counts(table: Dict[str, Tuple[str, str, str]]) -> Dict[str, int]:
    """status -> number of families."""
    out: Dict[str, int] = {}
    for status, _, _ in table.values():
        out[status] = out.get(status, 0) + 1
    return out


def summary(table: Dict[str, Tuple[str, str, str]]) -> str:
    """``"N of T model classes ok, R refused (...)"``: the count the READMEs quote."""
    total = counts(table)
    rest = ", ".join(f"{v} {k}" for k, v in sorted(total.items()) if k != "ok")
    return (f"{total.get('ok', 0)} of {len(table)} model classes with a plan ok"
            + (f", {rest}" if rest else ""))


def markdown(table: Dict[str, Tuple[str, str, str]], families: Sequence[str]) -> str:
    """The docs' table of a sweep TSV: the summary, then one row per family of ``families``
    (``not run`` where the TSV has none yet)."""
    rows = {f: table.get(f, ("not run", "", "")) for f in families}
    lines = [summary(rows) + ".", "",
             "| model class | status | sharded per rank (plan) | reason |", "|---|---|---|---|"]
    for family, (status, sharded, reason) in rows.items():
        reason = reason.replace("|", "\\|")
        lines.append(f"| {family} | {status} | {sharded} | {reason[:240]} |")
    return "\n".join(lines)


@pytest.mark.skipif(os.environ.get("SLAPO_SLOW_TESTS") != "1",
                    reason="slow: set SLAPO_SLOW_TESTS=1")
def test_every_family_with_a_plan_is_ok_or_refused(tmp_path):
    table = sweep(plan_families(), str(tmp_path / "sweep.tsv"), jobs=2)
    bad = {f: r for f, r in table.items() if r[0] not in ("ok", "refused", UNBUILT)}
    assert not bad, bad


FAST_ROWS = ("eurobert:masked",)


def test_sweep_rows_fast_subset(tmp_path):
    """The sweep's machinery on a representative row (a masked LM, through the worker and its
    2 ranks): every rank's sharded fraction against the plan's; then how rows combine (the
    first failing rank decides) and the docs' table."""
    table = sweep(FAST_ROWS, str(tmp_path / "sweep.tsv"))
    status, sharded, _ = table["eurobert:masked"]
    assert status == "ok", table
    assert sharded.startswith("r0=") and " r1=" in sharded and "plan=" in sharded, sharded
    got = [float(x.split("=")[1]) for x in sharded.split()]
    assert abs(got[0] - got[2]) < 0.01 and abs(got[1] - got[2]) < 0.01, sharded
    assert read_table(str(tmp_path / "sweep.tsv")) == table
    result, cell = combine([("ok", 0.5, 0.5), ("ConfigError: x is wrong", 0.0, 0.0)])
    assert result == "ConfigError: rank 1: x is wrong" and cell == ""
    rows = {**table, "llama4_text": (verdict(result), "", result)}
    text = markdown(rows, ["eurobert:masked", "llama4_text"])
    assert text.startswith("1 of 2 model classes with a plan ok, 1 refused."), text


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
    print(summary(table))
    return 0 if all(s in ("ok", "refused", UNBUILT) for s, _, _ in table.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
