"""Kernels chosen as on the simulated device, not as on the CPU the fake tensors live on.

Fake tensors are CPU tensors, so ``F.scaled_dot_product_attention`` dispatches as on a CPU:
with dropout (BERT, RoBERTa, OPT, T5 train with attention dropout) the CPU has no fused kernel
and runs the *math* path, which materialises the ``B x H x L x S`` scores, their softmax and the
dropout mask (and keeps them for the backward). A GPU runs a fused kernel instead, which keeps
only the output and one log-sum-exp per row. Within :class:`GpuAttention` (entered for every
GPU profile) each SDPA call runs PyTorch's memory-efficient attention op
(``aten._scaled_dot_product_efficient_attention``, the kernel CUDA picks on V100 and later for a
mask and dropout; its fake/meta implementation and backward give the shapes, its FLOPs are in
PyTorch's FLOP table). A boolean mask becomes the additive bias that kernel takes; grouped
key/value heads are repeated to the query's heads. Attention written out by hand (HF's
``eager`` implementation: GPT-Neo; megatron-core's local ``DotProductAttention``)
materialises the scores on a GPU too and is left as it is. Slapo's op library, which on a CPU
tensor with dropout runs its own math kernel, takes the fused kernel too within the mode, as it
would on a GPU: the mode selects it through the library's public choice,
:func:`slapo.op.cpu_dropout_kernel`.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from slapo.op import cpu_dropout_kernel

__all__ = ["GpuAttention", "fused_attention"]


def _bias(mask: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor
          ) -> Optional[torch.Tensor]:
    """The additive bias of shape B x H x L x S (a broadcast view) for ``mask``."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.where(mask, torch.zeros((), dtype=q.dtype),
                           torch.full((), float("-inf"), dtype=q.dtype))
    return mask.to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def fused_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention`` through the memory-efficient fused kernel (module
    docstring); the same result shape."""
    if key.shape[-3] != query.shape[-3]:  # grouped-query attention: one k/v per query head
        repeat = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(repeat, dim=-3)
        value = value.repeat_interleave(repeat, dim=-3)
    grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (query, key, value) if t is not None)
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, _bias(attn_mask, query, key), grad, dropout_p, is_causal,
        scale=scale)
    return out[0]


def _sdpa(query, *args, **kwargs):
    if query.dim() == 4:
        return fused_attention(query, *args, **kwargs)
    return _ORIGINAL(query, *args, **kwargs)


_ORIGINAL = F.scaled_dot_product_attention


class GpuAttention(TorchFunctionMode):
    """Within: every 4-d ``F.scaled_dot_product_attention`` runs :func:`fused_attention`.

    A torch-function mode catches every call (fx graphs hold the function itself), but the
    autograd engine does not carry it into the recomputation of ``torch.utils.checkpoint``, so
    the module attribute ``torch.nn.functional.scaled_dot_product_attention`` is replaced too
    (what HF and Slapo's op library call, also when recomputing). A traced graph recomputed
    under checkpointing would still run the CPU kernel there: checkpointing then raises its
    ``CheckpointError`` (a different number of saved tensors), never a silent mix."""

    def __enter__(self):
        F.scaled_dot_product_attention = _sdpa
        self._slapo = contextlib.ExitStack()
        self._slapo.enter_context(cpu_dropout_kernel(fused_attention))
        return super().__enter__()

    def __exit__(self, *exc):
        F.scaled_dot_product_attention = _ORIGINAL
        self._slapo.close()
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _ORIGINAL and args and args[0].dim() == 4:
            return fused_attention(*args, **kwargs)
        return func(*args, **kwargs)
