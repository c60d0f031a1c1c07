"""A grid of the planner's candidates measured for real on this CPU, and read back per candidate.

**Measuring** (:func:`measure_grid`): the sweep (``python -m end2end.sweep CONFIG --device cpu
--repeat R``, in this process) runs every candidate's config line through the driver in
interleaved rounds, resumably. A results file identifies a run by its key (mode, model, ranks,
sequence, batch, CKPT, TP x PP, knobs, round) without the micro-batch, so candidates that differ
only in their micro-batch (the megatron modes' gradient accumulation, pipelines) cannot share a
file: the grid is split into parts (:func:`grid_parts`) of distinct keys, ``DIR/part-K.cfg``
measured into ``DIR/measured-K.tsv``, and each round runs every part before the next round
starts, so every candidate is measured once per round, all rounds alike.

**Reading** (:func:`read_measured`): a results file's rows are matched to the candidates by that
key (and dtype); where several candidates share it, by the micro-batch the row's JSON twin
records (``extra.micro_batch``), else the one the driver runs without a ``micro_batch`` option
(:func:`end2end.spec.layout.default_micro_batch`): a row of a file measured without the
planner's pragmas (the Figure 10 grid) is the run with no gradient accumulation. A row whose
twin records another micro-batch than its candidate's (a part file left from a study with other
options in the same ``--out``) is not that candidate's: use a fresh ``--out`` for new options.

**Judging** (:func:`judge`): per candidate the median samples/s over its ``ok`` rounds, with the
slowest and fastest round. A candidate fits when every round is ``ok`` and, with a memory cap,
the median peak memory per rank (``PerGPUMem``) is within it; any ``oom``/``fail``/``timeout``
round makes it not fit (the status of its first such round). A candidate without a row is
``unmeasured``: listed, never dropped.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from slapo.errors import ConfigError

from end2end.plan.space import Candidate
from end2end.results.store import ResultRow, read_results, twin_path
from end2end.spec.layout import default_micro_batch
from end2end.spec.runspec import default_parallel_sizes, run_key

__all__ = ["Measured", "candidate_key", "grid_parts", "write_config", "measure_grid",
           "read_measured", "check_measured", "judge", "part_paths", "UNMEASURED"]

UNMEASURED = "unmeasured"


@dataclass
class Measured:
    """What the measurements say of one candidate (module docstring, "Judging")."""

    status: str
    thrpt: float = 0.0
    """Median samples/s over the ``ok`` rounds (0 when none)."""
    thrpt_min: float = 0.0
    thrpt_max: float = 0.0
    memory_gb: float = 0.0
    """Median peak memory per rank (``PerGPUMem``) over the ``ok`` rounds."""
    rounds: int = 0
    error: str = ""
    statuses: List[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.status == "ok"


def candidate_key(cand: Candidate) -> Tuple:
    """The results-file key of ``cand``'s run, without the round (``ResultRow.key[:-1]``)."""
    return run_key(cand.mode, cand.model, cand.seq, cand.dec, cand.n, cand.batch, cand.ckpt,
                   cand.tp, cand.pp, cand.knobs)[:-1]


def grid_parts(grid: Sequence[Candidate]) -> List[List[Candidate]]:
    """The grid in parts whose candidates have distinct keys (module docstring): part K holds
    the K-th candidate of every key, in grid order."""
    parts: List[List[Candidate]] = []
    seen: Dict[Tuple, int] = defaultdict(int)
    for cand in grid:
        k = seen[candidate_key(cand)]
        seen[candidate_key(cand)] += 1
        if k == len(parts):
            parts.append([])
        parts[k].append(cand)
    return parts


def write_config(path: Path, cands: Sequence[Candidate], steps: int, warmup: int,
                 header: str = "") -> None:
    """``cands`` as a config file: each candidate's ``line`` after ``#@ reset steps=.. warmup=..``
    (so no candidate's options carry over to the next)."""
    lines = [f"# {text}" for text in header.splitlines()]
    for cand in cands:
        lines += [f"#@ reset steps={steps} warmup={warmup}", cand.line]
    path.write_text("\n".join(lines) + "\n")


def part_paths(out: Path, k: int) -> Tuple[Path, Path]:
    """``(DIR/part-K.cfg, DIR/measured-K.tsv)`` of part ``k`` (1-based)."""
    return out / f"part-{k}.cfg", out / f"measured-{k}.tsv"


def measure_grid(out: Path, grid: Sequence[Candidate], repeat: int, steps: int, warmup: int,
                 timeout: float, budget_gb: Optional[float]) -> int:
    """Measure ``grid`` in ``repeat`` interleaved rounds through the sweep (module docstring);
    resumable. Returns 0, or the sweep's status when it was interrupted (130) or refused (2)."""
    from end2end.sweep.single_node import main as sweep

    parts = grid_parts(grid)
    for k, part in enumerate(parts, start=1):
        config, _ = part_paths(out, k)
        write_config(config, part, steps, warmup,
                     f"part {k} of {len(parts)} of the grid in {out / 'grid.cfg'}")
    extra = ["--mem-budget-gb", str(budget_gb)] if budget_gb else []
    for r in range(1, repeat + 1):
        for k in range(1, len(parts) + 1):
            config, results = part_paths(out, k)
            status = sweep([str(config), "--results", str(results), "--device", "cpu",
                            "--repeat", str(r), "--timeout", str(timeout), *extra])
            if status in (2, 130):
                return status
    return 0


def _twin_micros(path: Path, count: int) -> List[Optional[int]]:
    """The micro-batch each row's JSON twin records (``None`` where it does not, or for every
    row when the twin does not hold the TSV's rows)."""
    micros: List[Optional[int]] = []
    twin = twin_path(path)
    if twin.is_file():
        for line in twin.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                return [None] * count
            if isinstance(rec, dict) and rec.get("type") == "row":
                micro = (rec.get("extra") or {}).get("micro_batch")
                micros.append(int(micro) if isinstance(micro, (int, float)) else None)
    return micros if len(micros) == count else [None] * count


def _row_micro(row: ResultRow, recorded: Optional[int]) -> int:
    if recorded:
        return recorded
    if row.tp is not None and row.pp is not None:
        tp, pp = row.tp, row.pp
    else:
        tp, pp, _ = default_parallel_sizes(row.impl, row.ngpu)
    return default_micro_batch(row.batch // max(1, row.ngpu // (tp * pp)), pp)


def check_measured(path: Path, model: str, seq: int) -> None:
    """A ``ConfigError`` (one line) when ``path`` is not a results file with a row of
    ``model`` at sequence ``seq`` (a missing file, another study's file)."""
    if not path.is_file():
        raise ConfigError(f"--measured {path}: no such results file",
                          call="end2end.plan.cpu_study", hint="give a results TSV measured "
                          "earlier, e.g. docs/results/reproduce-full/autotune/autotune-bert.tsv")
    rows = read_results(path).rows
    if not any((r.model, r.seq) == (model, seq) for r in rows):
        found = sorted({f"{r.model} seq {r.seq}" for r in rows}) or ["no rows"]
        raise ConfigError(f"--measured {path} holds no row of {model} at seq {seq} (it has "
                          f"{', '.join(found[:4])})", call="end2end.plan.cpu_study",
                          hint="give the results file measured for this model and sequence")


def read_measured(path: Path, cands: Sequence[Candidate]) -> Dict[Candidate, List[ResultRow]]:
    """The rows of ``path`` per candidate of ``cands`` (module docstring, "Reading")."""
    rows = read_results(path).rows
    by_key: Dict[Tuple, List[Candidate]] = defaultdict(list)
    for cand in cands:
        by_key[candidate_key(cand)].append(cand)
    out: Dict[Candidate, List[ResultRow]] = defaultdict(list)
    for row, recorded in zip(rows, _twin_micros(path, len(rows))):
        same = [c for c in by_key.get(row.key[:-1], []) if row.dtype in ("", c.dtype)]
        if len(same) > 1 or recorded:  # a recorded micro-batch must be the candidate's
            same = [c for c in same if c.micro == _row_micro(row, recorded)]
        if len(same) == 1 and row.status not in ("sim", "sim-oom"):
            out[same[0]].append(row)
    return out


def judge(rows: Sequence[ResultRow], cap_gb: Optional[float] = None) -> Measured:
    """One candidate's :class:`Measured` from its rows (module docstring, "Judging")."""
    if not rows:
        return Measured(UNMEASURED)
    statuses = [r.status for r in rows]
    ok = [r for r in rows if r.status == "ok" and r.thrpt is not None]
    thrpts = [float(r.thrpt) for r in ok if r.thrpt is not None]
    mems = [float(r.per_gpu_mem) for r in ok if r.per_gpu_mem is not None]
    out = Measured("ok", statistics.median(thrpts) if thrpts else 0.0,
                   min(thrpts, default=0.0), max(thrpts, default=0.0),
                   statistics.median(mems) if mems else 0.0, len(rows), statuses=statuses)
    bad = next((r for r in rows if r.status != "ok"), None)
    if bad is not None:
        out.status, out.error = bad.status, " ".join(bad.error.split())[:200]
    elif cap_gb is not None and out.memory_gb > cap_gb:
        out.status = "oom"
        out.error = f"measured {out.memory_gb:.3g} GB per rank > cap {cap_gb:g} GB"
    return out
