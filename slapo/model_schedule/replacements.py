"""Module replacements the recipes share: the op library's modules in place of HF's.

Each takes a schedule and a module path and calls ``replace`` (the new module built on the meta
device with ``delay_init``):

* :func:`replace_attention`: the op library's SDPA attention (:func:`slapo.op.attention_from_hf`,
  weights copied), which :func:`slapo.model_schedule.common.shard_attention` shards by heads;
* :func:`replace_mlp`: an MLP with the bias add fused into the GeLU;
* :func:`replace_residual_norm`: BERT's sub-layer epilogue (bias, dropout, residual, LayerNorm);
* :func:`native_gelu`: a GeLU written as Python element-wise ops becomes ``nn.GELU``;
* :func:`fuse_rms_norms`, :func:`fast_dropout`: model-wide swaps of HF's RMSNorms and of
  ``nn.Dropout``.

Re-exported by :mod:`slapo.model_schedule.common`, where the recipes reach them.
"""

from __future__ import annotations

from typing import Any, List, Optional

from torch import nn

from ..schedule import Schedule
from ..weights.delayed_init import init_empty_weights
from .config import ScheduleConfig

__all__ = ["replace_attention", "replace_mlp", "replace_residual_norm", "native_gelu",
           "fuse_rms_norms", "fast_dropout", "RMS_NORMS"]


def replace_attention(sch: Schedule, path: str, cfg: ScheduleConfig, *,
                      fused_qkv: Optional[bool] = None) -> bool:
    """Replace the HF attention at ``path`` by the op library's (``cfg.attn_kernel`` backend;
    ``"eager"`` keeps HF's and returns False). Built on the meta device with ``delay_init``."""
    from ..op import attention_from_hf

    if cfg.attn_kernel == "eager":
        return False
    with init_empty_weights(enable=cfg.delay_init):
        new = attention_from_hf(sch[path].mod, fused_qkv=fused_qkv, backend=cfg.attn_kernel)
    sch[path].replace(new)
    return True


def replace_mlp(sch: Schedule, path: str, cfg: ScheduleConfig, bias_gelu: Any) -> bool:
    """With ``bias_gelu`` (True = ``torch.compile`` inductor, a string = that backend,
    ``"eager"`` = the unfused reference), replace the MLP at ``path`` by the op library's with
    the bias add fused into the GeLU (:func:`slapo.op.mlp_from_hf`)."""
    from ..op import mlp_from_hf

    if bias_gelu is False or bias_gelu is None:
        return False
    compile_ = None if bias_gelu == "eager" else bias_gelu
    with init_empty_weights(enable=cfg.delay_init):
        new = mlp_from_hf(sch[path].mod, fuse_bias_gelu=True, compile=compile_)
    sch[path].replace(new)
    return True


def replace_residual_norm(sch: Schedule, path: str, cfg: ScheduleConfig, how: Any) -> bool:
    """With ``how`` (True = ``torch.compile`` inductor, a string = that backend, ``"eager"`` =
    the unfused reference), replace the sub-layer epilogue at ``path`` (BERT's
    ``attention.output`` / ``output``) by the op library's: the dense bias decomposed and fused
    with dropout, the residual add and the LayerNorm (:func:`slapo.op.residual_norm_from_hf`)."""
    from ..op import residual_norm_from_hf

    if how is False or how is None:
        return False
    with init_empty_weights(enable=cfg.delay_init):
        new = residual_norm_from_hf(sch[path].mod, compile=None if how == "eager" else how)
    sch[path].replace(new)
    return True


RMS_NORMS = ("T5LayerNorm", "LlamaRMSNorm")


def fuse_rms_norms(sch: Schedule) -> List[str]:
    """Replace every HF RMSNorm (``T5LayerNorm``, ``LlamaRMSNorm``) of the model by the op
    library's one-function :class:`slapo.op.rms_norm.RMSNorm` (same ``weight``); returns the
    paths."""
    from ..op.rms_norm import RMSNorm

    paths = [path for path, mod in sch.mod.named_modules() if type(mod).__name__ in RMS_NORMS]
    for path in paths:
        sch[path].replace(RMSNorm.from_hf(sch[path].mod))
    return paths


def fast_dropout(sch: Schedule) -> List[str]:
    """Swap every ``nn.Dropout`` with ``p > 0`` (exactly that class) of the model for the op
    library's :class:`slapo.op.dropout.Dropout` (same ``p``, cheaper mask on the CPU), keeping
    its forward wrappers (e.g. ``fork_rng``); returns the paths."""
    from ..op.dropout import Dropout
    from ..runtime.forward_wrap import copy_forward_wrappers

    paths = [path for path, mod in sch.mod.named_modules()
             if type(mod) is nn.Dropout and mod.p > 0]
    for path in paths:
        node = sch[path]
        old = node.mod
        assert isinstance(old, nn.Dropout)  # chosen above
        node.replace(Dropout.from_module(old))
        copy_forward_wrappers(old, node.mod)
    return paths


def native_gelu(sch: Schedule, path: str) -> bool:
    """Replace a HF GeLU written as Python element-wise ops (GPT-2's ``NewGELUActivation`` is
    ``0.5 * x * (1 + tanh(...))``: six kernels forward, more backward) by ``nn.GELU`` with the
    same formula (one ATen kernel each way; equal up to float rounding). Returns whether it
    replaced; other activations, and GeLUs that already are one kernel, are left alone."""
    import torch.nn.functional as F

    from ..op.mlp import gelu_kind

    mod = sch[path].mod
    kind = gelu_kind(mod)
    if kind is None or isinstance(mod, nn.GELU) or getattr(mod, "act", None) is F.gelu:
        return False
    sch[path].replace(nn.GELU(approximate=kind))
    return True
