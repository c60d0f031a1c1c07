"""The steps of the progressive ablation (Figure 9) and which results row is which step.

A step is recognised from what its run did, as recorded in the row (mode, tensor-parallel
degree, knobs, checkpoint ratio), never from its position in the file, so the figure is drawn
from the results file alone and a reordered or resumed sweep still lands every run in its
step. The configs in ``ablation/configs/`` list the steps in this order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from end2end.results.store import ResultRow
from end2end.spec.modes import MODE_TABLE

__all__ = ["STEPS", "Step", "step_of", "AblationError"]


class AblationError(ValueError):
    """A results row that is no step of the ablation."""


@dataclass(frozen=True)
class Step:
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
