"""What the planner assumes of a CKPT value before anything is simulated: which values it tries,
the share of the forward it recomputes, what a layer keeps, and which value holds more.

The CKPT values are the config grammar's (:mod:`end2end.spec.config_file`): a ratio of layers
checkpointed whole (the Slapo modes), ``op`` (every layer checkpointed selectively with
torchtitan's "op" policy, :data:`end2end.spec.runspec.SELECTIVE_CKPT`: the outputs of every
second matmul and of the attention kernels kept, the rest recomputed), ``selective``/``full``
(Megatron's), ``0``/``1`` (HF gradient checkpointing). These numbers only order and prune the
space (the simulator, which runs the checkpointing itself, decides); each is derived below from
what the policy keeps, not fitted to a simulation.
"""

from __future__ import annotations

from typing import Tuple

from end2end.spec.modes import get_mode
from end2end.spec.runspec import SELECTIVE_CKPT

__all__ = ["ckpt_choices", "ckpt_fraction", "checkpointed_share", "activation_sbh",
           "holds_at_least", "holds_at_least_knobs"]

#: Megatron's ``selective`` recomputes the attention core only (Korthikanti et al. 2022, §4.2):
#: a small share of a layer's forward FLOPs at the planner's sequence lengths, counted as 0.1
SELECTIVE_SHARE = 0.1
#: ``op`` recomputes the unsaved half of the matmuls and the element-wise ops, keeps the
#: attention kernels' outputs: about half of a layer's forward FLOPs
OP_SHARE = 0.5


def ckpt_choices(mode: str, vision: bool = False) -> Tuple[str, ...]:
    """The CKPT values the planner tries for ``mode``: ``0, 0.5, op, 1`` (ratio modes; ``op``
    not on vision models, which the driver refuses it for), ``0, selective, full`` (megatron),
    ``0, 1`` (HF gradient checkpointing)."""
    kind = get_mode(mode).ckpt
    if kind == "ratio":
        return ("0", "0.5", "1") if vision else ("0", "0.5", *SELECTIVE_CKPT, "1")
    return {"megatron": ("0", "selective", "full")}.get(kind, ("0", "1"))


def ckpt_fraction(ckpt: str) -> float:
    """The share of the forward pass recomputed in the backward pass (module constants)."""
    if ckpt in SELECTIVE_CKPT:
        return OP_SHARE
    return {"full": 1.0, "selective": SELECTIVE_SHARE}.get(ckpt, None) or float(ckpt)


def checkpointed_share(ckpt: str) -> float:
    """The share of layers that may keep as little as their input (the memory lower bound's
    :func:`end2end.plan.rules.memory_lower_bound`): ``op`` checkpoints every layer."""
    return 1.0 if ckpt in SELECTIVE_CKPT else ckpt_fraction(ckpt)


def activation_sbh(ckpt: str, tp: int, sequence_parallel: bool = False) -> float:
    """A layer's activations kept for the backward pass, in units of ``s x b x h`` bytes at two
    bytes an element (Korthikanti et al. 2022, Eq. 1 without the attention scores that fused
    attention does not keep: ``10 + 24 / TP`` for a layer kept whole, 2 for a checkpointed
    layer's input; a ratio ``r`` mixes the two). ``op`` keeps the layer's input (2), the
    attention output (2 / TP) and every second matmul's output: of a GPT layer's QKV (6 / TP),
    projection (2), FC1 (8 / TP) and FC2 (2), about half, ``2 + 6 / TP``. Sequence
    parallelism splits the terms not divided by TP as well (their Eq. 4: ``34 / TP``)."""
    if sequence_parallel:
        return activation_sbh(ckpt, 1) / tp
    if ckpt in SELECTIVE_CKPT:
        return 2 + 2 / tp + 2 + 6 / tp
    r = ckpt_fraction(ckpt)
    return r * 2 + (1 - r) * (10 + 24 / tp)


def holds_at_least_knobs(a: str, b: str) -> bool:
    """Whether a run with the recipe knobs ``a`` keeps at least the activations of one with
    ``b``, all else equal: the same knobs, or ``b`` sequence parallel and ``a`` not."""
    sp_a, sp_b = ("sequence_parallel=True" in k.split(",") for k in (a, b))
    rest_a, rest_b = ({x for x in k.split(",") if x and x != "sequence_parallel=True"}
                      for k in (a, b))
    return rest_a == rest_b and (sp_b or not sp_a)


def holds_at_least(a: str, b: str) -> bool:
    """Whether a run with CKPT ``a`` keeps at least the activations of one with ``b``, all else
    equal (a partial order: ``op`` against a ratio strictly between 0 and 1 is unordered)."""
    if a == b:
        return True
    if b in SELECTIVE_CKPT:
        return ckpt_fraction(a) == 0.0
    if a in SELECTIVE_CKPT:
        return ckpt_fraction(b) == 1.0
    return ckpt_fraction(a) <= ckpt_fraction(b)
