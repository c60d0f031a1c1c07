"""Limits on the planner's space: the CKPT values, TP and PP sizes, gradient-accumulation
steps and recipe knobs to search instead of the planner's own choices.

A study that compares the planner with a measured grid needs the planner to search that grid:
Figure 10's is one layout (``slapo-megatron`` TP 2, no gradient accumulation) over batch x
checkpoint ratio 0, 0.25, ..., 1, ratios the planner does not try by itself
(``end2end.plan.ckpt.ckpt_choices``). ``SpaceLimits(ckpt=("0", "0.25", ...), tp=(2,),
accumulation=(1,))`` is that space (``python -m end2end.plan.cpu_study --ckpt ... --tp 2
--accumulation 1``). Empty fields leave the planner's choices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from end2end.spec.modes import get_mode
from end2end.spec.runspec import SELECTIVE_CKPT, format_ratio

__all__ = ["SpaceLimits", "NO_LIMITS", "accepted_ckpt"]


def accepted_ckpt(mode: str, value: str, vision: bool = False) -> Optional[str]:
    """``value`` as ``mode``'s config lines write it (canonical: ``0.50`` -> ``0.5``, ``full``
    -> ``1`` for a ratio), or ``None`` when the mode does not take it: ratios in [0, 1] and
    ``op`` (not on vision models) for the Slapo modes, ``0 selective full`` for megatron,
    ``0 1`` for HF gradient checkpointing (the config grammar's reading,
    ``end2end.spec.config_file``, without its warning for megatron's ``1``)."""
    text, kind = value.strip().lower(), get_mode(mode).ckpt
    if kind == "megatron":
        return {"0": "0", "0.0": "0", "selective": "selective", "full": "full"}.get(text)
    if kind != "ratio":
        return {"0": "0", "0.0": "0", "1": "1", "1.0": "1", "full": "1"}.get(text)
    if text == "full":
        return "1"
    if text in SELECTIVE_CKPT:
        return None if vision else text
    try:
        ratio = float(text)
    except ValueError:
        return None
    return format_ratio(ratio) if 0.0 <= ratio <= 1.0 else None


@dataclass(frozen=True)
class SpaceLimits:
    """What to search (module docstring): CKPT values (each where the mode takes it), TP and PP
    sizes, gradient-accumulation steps (micro-batches per replica and step; 1: the replica's
    whole batch at once), recipe-knob texts (``""``: the recipe's defaults). Empty: the
    planner's own choices."""

    ckpt: Tuple[str, ...] = ()
    tp: Tuple[int, ...] = ()
    pp: Tuple[int, ...] = ()
    accumulation: Tuple[int, ...] = ()
    knobs: Tuple[str, ...] = ()

    def knob_texts(self, planned: Sequence[str]) -> Tuple[str, ...]:
        """The knob texts tried for one layout: the planner's (``planned``: what the layout
        allows, :func:`end2end.plan.space.knob_choices`) that are among the given ones."""
        return tuple(planned) if not self.knobs else tuple(k for k in planned
                                                           if k in self.knobs)

    def ckpts(self, mode: str, planned: Sequence[str], vision: bool) -> Tuple[str, ...]:
        """The CKPT values tried for ``mode``: the given ones it takes, else ``planned`` (the
        planner's)."""
        if not self.ckpt:
            return tuple(planned)
        taken = (accepted_ckpt(mode, v, vision) for v in self.ckpt)
        return tuple(dict.fromkeys(v for v in taken if v is not None))

    def allows_layout(self, tp: int, pp: int) -> bool:
        """Whether TP x PP is among the given sizes."""
        return (not self.tp or tp in self.tp) and (not self.pp or pp in self.pp)

    def micros(self, planned: Sequence[int], local: int) -> List[int]:
        """The micro-batches tried for a replica batch of ``local`` samples: ``planned`` (the
        planner's), or ``local / a`` for each given accumulation ``a`` that divides it."""
        if not self.accumulation:
            return list(planned)
        return sorted({local // a for a in self.accumulation if local % a == 0})


#: The planner's own choices everywhere (the default of ``enumerate_space`` and ``SearchOptions``)
NO_LIMITS = SpaceLimits()
