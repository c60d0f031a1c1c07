"""The progressive ablation (Figure 9) read from its results file: which row is which step, and
each step's median, range and speedup over vanilla HF.

A step is recognised from what its run did, as recorded in the row (mode, tensor-parallel
degree, knobs, checkpoint ratio), never from its position in the file, so the figure is drawn
from the results file alone and a reordered or resumed sweep still lands every run in its
step. The configs in ``ablation/configs/`` list the steps in this order. Every ``ok`` row is one
measurement of one step; repeats of a step (the sweep's interleaved rounds) give its median and
min-max (a pandas groupby over the rows' DataFrame, :func:`summarise`). ``python -m ablation.plot``
draws it; the report's ``ablation`` and ``ablation-predicted`` kinds tabulate it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import pandas as pd

from end2end.spec.modes import MODE_TABLE

from .stats import to_frame
from .store import ResultRow

__all__ = ["STEPS", "Step", "step_of", "AblationError", "StepResult", "summarise",
           "format_table"]


class AblationError(ValueError):
    """A results row that is no step of the ablation."""


@dataclass(frozen=True)
class Step:
    """One step of the ablation: its position, its label in the figure and what it adds."""

    index: int
    label: str
    what: str


STEPS: Tuple[Step, ...] = (
    Step(0, "Vanilla HF", "the HF model in eager PyTorch"),
    Step(1, "+ Kernel opt.", "Slapo schedule at TP=1: op-library SDPA attention (fused QKV), "
         "the recipe's kernel replacements and any kernel knobs of the line"),
    Step(2, "+ Attn/FFN TP", "attention heads and MLP sharded (column/row) with their "
         "all-reduces; word embedding and LM head replicated (knob shard_embedding=False)"),
    Step(3, "+ Embedding TP", "also the word embedding and the LM head vocab-parallel"),
    Step(4, "+ Checkpointing", "activation checkpointing of a fraction of the layers (CKPT)"),
)


def _ckpt_ratio(text: str) -> float:
    try:
        return 1.0 if text == "full" else float(text)
    except ValueError:
        raise AblationError(f"checkpoint setting {text!r} is not a ratio") from None


REPLICATED_EMBEDDING = "shard_embedding=False"


def step_of(row: ResultRow) -> Step:
    """The step that ``row``'s run measured (:class:`AblationError` if none). Knobs other than
    ``shard_embedding=False`` are kernel choices (e.g. ``fuse_bias_gelu=True`` at paper scale)
    and do not change the step."""
    mode = MODE_TABLE.get(row.impl)
    slapo = mode is not None and mode.slapo
    # the vanilla step: the unscheduled model on plain PyTorch, data parallel (``eager``)
    vanilla = mode is not None and not mode.slapo and mode.framework == "torch" \
        and not mode.tp_default
    tp = row.tp or 1
    knobs = set(filter(None, (row.knobs or "").split(",")))
    replicated, ckpt = REPLICATED_EMBEDDING in knobs, _ckpt_ratio(row.ckpt)
    if vanilla and tp == 1 and not knobs:
        return STEPS[0]
    if slapo and tp == 1 and not replicated and ckpt == 0:
        return STEPS[1]
    if slapo and tp > 1 and replicated and ckpt == 0:
        return STEPS[2]
    if slapo and tp > 1 and not replicated:
        return STEPS[3] if ckpt == 0 else STEPS[4]
    raise AblationError(f"the run {row.impl} n={row.ngpu} tp={tp} knobs={row.knobs or '-'} "
                        f"ckpt={row.ckpt} is no step of the ablation")


@dataclass
class StepResult:
    """One step: its run's identity and ranks; the median and min-max (samples/s) of its ok
    repeats and how many they are (``median`` None: none is ok); the statuses of the repeats
    that were not ok; the median's speedup over vanilla HF (None: no vanilla median) and
    whether its range overlaps the previous step's (within noise)."""

    step: Step
    run: Tuple
    ranks: int
    median: Optional[float] = None
    lo: Optional[float] = None
    hi: Optional[float] = None
    repeats: int = 0
    failed: List[str] = field(default_factory=list)
    vs_vanilla: Optional[float] = None
    within_noise: bool = False

    @property
    def range(self) -> Tuple[float, float]:
        return self.lo, self.hi

    def per_rank(self, value: float) -> float:
        return value / self.ranks


def _identity(row: ResultRow) -> Tuple:
    """What must be equal for two rows to be repeats of one run (the key without the repeat)."""
    return row.key[:-1]


def summarise(rows: Sequence[ResultRow]) -> List[StepResult]:
    """The steps present in ``rows``, in step order. Refuses rows of several models, rows that
    are no step, and two different runs for one step (e.g. two batch sizes)."""
    models = sorted({r.model for r in rows})
    if len(models) > 1:
        raise AblationError(f"rows of several models ({', '.join(models)}): one ablation "
                            "results file per model")
    frame = to_frame(rows).assign(Step=[step_of(r).index for r in rows],
                                  Run=[_identity(r) for r in rows])
    _refuse_two_runs(frame)
    summary = _step_frame(frame)
    return [StepResult(STEPS[i], s.Run, int(s.Ranks), _number(s.Median), _number(s.Lo),
                       _number(s.Hi), int(s.Repeats), s.Failed, _number(s.VsVanilla),
                       bool(s.WithinNoise)) for i, s in summary.iterrows()]


def _refuse_two_runs(frame: pd.DataFrame) -> None:
    """:class:`AblationError` at the first row whose run is not its step's first run."""
    first = frame.groupby("Step").Run.transform("first")
    other = frame[[run != want for run, want in zip(frame.Run, first)]]
    if len(other):
        row = other.iloc[0]
        raise AblationError(f"two different runs for step '{STEPS[row.Step].label}': "
                            f"{first[row.name]} and {row.Run}; keep one per results file")


def _step_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per step present (ascending): ``Run``, ``Ranks``, the ok repeats' ``Median``,
    ``Lo``, ``Hi`` and count (``Repeats``), the ``Failed`` statuses, ``VsVanilla`` (the median
    over step 0's) and ``WithinNoise`` (the range overlaps the previous step's)."""
    ok = frame.Status.eq("ok")
    out = frame.groupby("Step").agg(Run=("Run", "first"), Ranks=("nGPU", "first"))
    out = out.join(frame[ok].groupby("Step").Thrpt.agg(
        Median="median", Lo="min", Hi="max", Repeats="count"))
    out["Repeats"] = out.Repeats.fillna(0)
    out["Failed"] = frame[~ok].groupby("Step").Status.agg(list)
    out["Failed"] = [f if isinstance(f, list) else [] for f in out.Failed]
    vanilla = out.Median.get(0)
    out["VsVanilla"] = out.Median / vanilla if vanilla else math.nan  # also NaN: no vanilla
    out["WithinNoise"] = (out.Lo <= out.Hi.shift()) & (out.Lo.shift() <= out.Hi)
    return out


def _number(value: float) -> Optional[float]:
    return None if pd.isna(value) else float(value)


def format_table(results: Sequence[StepResult]) -> str:
    """A Markdown table: per step its run, samples/s (median, min-max, repeats), per rank, and
    the speedup of the medians over vanilla HF."""
    lines = ["| Step | Run | samples/s, median (min-max) | per rank | vs vanilla |",
             "|---|---|---:|---:|---:|"]
    for r in results:
        mode, _, seq, _, n, batch, ckpt, _, knobs = r.run
        run = f"`{mode}` n={n} bs={batch} seq={seq}" + (f" ckpt={ckpt}" if ckpt != "0" else "")
        run += f" `{knobs}`" if knobs else ""
        if r.median is None:
            lines.append(f"| {r.step.label} | {run} | {', '.join(r.failed)} | - | - |")
            continue
        ratio = f"{r.vs_vanilla:.2f}x" if r.vs_vanilla is not None else "-"
        lines.append(f"| {r.step.label} | {run} | {r.median:.3g} ({r.lo:.3g}-{r.hi:.3g}, "
                     f"{r.repeats}x) | {r.per_rank(r.median):.3g} | {ratio} |")
    return "\n".join(lines)
