"""The knobs of a model schedule: one typed, frozen config; unknown knobs are errors."""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any, Dict, List, Sequence, Tuple

import torch

from ..errors import ConfigError

__all__ = ["ScheduleConfig", "checkpoint_layer_ids", "make_config"]

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
ATTENTION_KERNELS = ("auto", "math", "flash", "efficient", "cudnn", "eager")
_BOOL_KNOBS = ("fuse", "sequence_parallel", "shard_embedding", "vocab_parallel_loss",
               "fast_dropout", "delay_init")


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    """Knobs shared by every model schedule.

    Attributes:
        group: tensor-parallel process group (None = the whole world when distributed).
        dtype: "fp32", "fp16" or "bf16"; the model is cast before scheduling.
        attn_kernel: attention kernel of the op library ("auto" lets torch pick; "eager" keeps
            the model's own attention).
        fuse: apply operator fusions where they are numerically exact (fused QKV projections;
            T5's and LLaMA's RMSNorms as one autograd function).
        ckpt_ratio: fraction of layers to checkpoint: exactly round(L * ratio) layers, evenly
            spaced (see ``checkpoint_layer_ids``).
        ckpt_policy: "" recomputes each checkpointed layer whole; a selective policy (a preset's
            name, ``"save_matmuls"`` or ``"save_every_other_matmul"``, or a ``slapo.SavePolicy``)
            keeps its matmul and attention outputs and recomputes the rest
            (``checkpoint(policy=...)``; the end2end CKPT ``op`` is ratio 1 with
            ``"save_every_other_matmul"``).
        sequence_parallel: shard activations along the sequence axis between TP regions
            (GPT/LLaMA families).
        shard_embedding: under TP, shard the word embedding and the LM head over the vocabulary
            (vocab-parallel); False keeps them replicated while the layers are still sharded
            (the ablation's "attention/FFN TP" step).
        vocab_parallel_loss: with a vocab-parallel LM head, compute the loss on the vocab-sharded
            logits (no batch x sequence x vocabulary all-gather; the outputs' logits are this
            rank's shard); False all-gathers the logits and the model's own loss runs on them.
        fast_dropout: swap every ``nn.Dropout`` of the scheduled model for
            :class:`slapo.op.dropout.Dropout` (on CPU half of ``F.dropout``'s forward +
            backward time, ``F.dropout`` elsewhere); False keeps the model's own.
        pipeline_cuts: layer indices after which to cut pipeline stages.
        delay_init: build replacement modules on the meta device.
        prefix: path of the backbone inside the model (e.g. "bert"); "" = detect.
    """

    group: Any = None
    dtype: str = "fp32"
    attn_kernel: str = "auto"
    fuse: bool = True
    ckpt_ratio: float = 0.0
    ckpt_policy: Any = ""
    sequence_parallel: bool = False
    shard_embedding: bool = True
    vocab_parallel_loss: bool = True
    fast_dropout: bool = True
    pipeline_cuts: Tuple[int, ...] = ()
    delay_init: bool = False
    prefix: str = ""

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ConfigError(f"dtype {self.dtype!r} is not supported", call="apply_schedule",
                              hint=f"use one of {', '.join(_DTYPES)}")
        if self.attn_kernel not in ATTENTION_KERNELS:
            raise ConfigError(f"attn_kernel {self.attn_kernel!r} is unknown",
                              call="apply_schedule",
                              hint=f"use one of {', '.join(ATTENTION_KERNELS)}")
        if not (isinstance(self.ckpt_ratio, (int, float)) and 0.0 <= self.ckpt_ratio <= 1.0):
            raise ConfigError(f"ckpt_ratio must be a number in [0, 1], got {self.ckpt_ratio!r}",
                              call="apply_schedule", hint="e.g. ckpt_ratio=0.5 checkpoints "
                              "half of the layers")
        self._check_ckpt_policy()
        for name in _BOOL_KNOBS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}",
                                  call="apply_schedule", hint=f"e.g. {name}=False")
        object.__setattr__(self, "pipeline_cuts", tuple(self.pipeline_cuts))

    def _check_ckpt_policy(self) -> None:
        from ..runtime.checkpoint_policy import POLICIES, SavePolicy

        policy = self.ckpt_policy
        if isinstance(policy, SavePolicy) or (isinstance(policy, str) and
                                              (policy == "" or policy in POLICIES)):
            return
        raise ConfigError(f"ckpt_policy {policy!r} is unknown", call="apply_schedule",
                          hint=f"use {', '.join(repr(n) for n in POLICIES)}, a slapo.SavePolicy "
                          "or '' (whole layers)")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]


def make_config(knobs: Dict[str, Any], extra: Sequence[str] = ()) -> Tuple[ScheduleConfig,
                                                                         Dict[str, Any]]:
    """Split ``knobs`` into a ``ScheduleConfig`` and the family-specific ``extra`` knobs.

    Raises:
        ConfigError: a knob that is neither common nor one of ``extra`` (with the closest name).
    """
    fields = {f.name for f in dataclasses.fields(ScheduleConfig)}
    unknown = [k for k in knobs if k not in fields and k not in extra]
    if unknown:
        names = sorted(fields | set(extra))
        close = difflib.get_close_matches(unknown[0], names, n=1)
        raise ConfigError(
            f"unknown knob(s) {', '.join(repr(k) for k in unknown)}", call="apply_schedule",
            hint=(f"did you mean '{close[0]}'? " if close else "") + f"knobs: {', '.join(names)}",
        )
    common = {k: v for k, v in knobs.items() if k in fields}
    return ScheduleConfig(**common), {k: v for k, v in knobs.items() if k in extra}


def checkpoint_layer_ids(num_layers: int, ratio: float) -> List[int]:
    """Indices of the layers to checkpoint: ``round(num_layers * ratio)`` of them (halves round
    up), spread evenly (the middle of each of k equal segments)."""
    k = int(math.floor(num_layers * ratio + 0.5))
    k = max(0, min(num_layers, k))
    return [int((i + 0.5) * num_layers / k) for i in range(k)]
