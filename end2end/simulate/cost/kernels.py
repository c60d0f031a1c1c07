"""Kernels chosen as on the simulated device, not as on the CPU the fake tensors live on.

Fake tensors are CPU tensors, so ``F.scaled_dot_product_attention`` dispatches as on a CPU:
with dropout (BERT, RoBERTa, OPT, T5 train with attention dropout) the CPU has no fused kernel
and runs the *math* path, which materialises the ``B x H x L x S`` scores, their softmax and the
dropout mask (and keeps them for the backward). A GPU picks a kernel by PyTorch's own rules
(``select_sdp_backend`` in ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``), which
:func:`select_kernel` follows for the simulated GPU's compute capability, in their order:

* ``flash`` (FlashAttention-2): sm80 to sm121; fp16 or bf16; no ``attn_mask`` (``is_causal`` is
  fine, but not with a query length other than the key's); q, k, v of one head size, at most
  256; on sm86-89/120 no training with head size in (192, 224], or in (224, 256] with dropout.
* ``efficient`` (memory-efficient attention, CUTLASS): sm50 to sm121; fp16 or fp32 below sm80,
  also bf16 from sm80; q and k of one head size, and q's and v's head sizes divisible by the
  GEMM alignment: 8 elements in fp16/bf16 on tensor cores (sm70+), 4 in fp32 from sm80, 1 in
  fp32 below (``minimum_gemm_alignment``). A mask is fine.
* ``math``: otherwise (``_scaled_dot_product_attention_math``: GEMMs, softmax, dropout; the
  scores are kept for the backward).

(cuDNN's attention, which PyTorch tries first only on sm90/sm100 with cuDNN newer than 9.15, is
left out: it is timed as flash would be.) GPT-2.9B's head size 110 in fp16 on a V100: flash is
not built for sm70 and 110 is not a multiple of 8, so the math path keeps its ``s x s`` scores.

Within :class:`GpuAttention` (entered for every GPU profile, with its compute capability) each
4-d SDPA call runs the chosen kernel's ATen op on fake tensors (their fake/meta implementation
and backward give the shapes; PyTorch's FLOP table has the fused ones). A boolean mask becomes
the additive bias the efficient kernel takes; grouped key/value heads are repeated to the
query's heads. Attention written out by hand (HF's ``eager`` implementation: GPT-Neo;
megatron-core's local ``DotProductAttention``) materialises the scores on a GPU too and is left
as it is. Slapo's op library, which on a CPU tensor with dropout runs its own math kernel,
takes the device's kernel too within the mode, as it would on a GPU: the mode selects it through
the library's public choice, :func:`slapo.op.cpu_dropout_kernel`. The kernels chosen in a run
are counted (:attr:`GpuAttention.chosen`) and the row's JSON says which.

Dropout too: on a CPU, ``F.dropout`` in training runs ``bernoulli_``, ``div_`` and ``mul`` (a
random tensor of the input's size and dtype, scaled, multiplied in); on CUDA, ATen's ``dropout``
takes its fused kernel when ``0 < p < 1`` (``is_fused_kernel_acceptable`` in
``aten/src/ATen/native/Dropout.cpp``): ``native_dropout``, one kernel writing the output and a
one-byte mask, whose backward is one multiply. Within the mode, ``F.dropout`` (not in place:
ATen's in-place ``dropout_`` has no fused path on CUDA either) runs ``native_dropout``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from slapo.op import cpu_dropout_kernel

__all__ = ["GpuAttention", "fused_attention", "select_kernel", "DEFAULT_CAPABILITY"]

#: the compute capability of a GPU profile without one (A100)
DEFAULT_CAPABILITY = (8, 0)
_HALF = (torch.float16, torch.bfloat16)


def _bias(mask: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor
          ) -> Optional[torch.Tensor]:
    """The additive bias of shape B x H x L x S (a broadcast view) for ``mask``."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.where(mask, torch.zeros((), dtype=q.dtype),
                           torch.full((), float("-inf"), dtype=q.dtype))
    return mask.to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def _gemm_alignment(dtype: torch.dtype, capability: Tuple[int, int]) -> int:
    """sdp_utils' ``minimum_gemm_alignment``: elements a head size must be a multiple of."""
    half = dtype in _HALF
    tensor_cores = capability >= (8, 0) or (capability >= (7, 0) and half)
    align = 4 if capability >= (8, 0) else 1
    return max(align, 128 // (16 if half else 32)) if tensor_cores else align


def select_kernel(query, key, value, has_mask: bool, dropout_p: float, is_causal: bool,
                  capability: Tuple[int, int], training: bool = True) -> str:
    """``flash``, ``efficient`` or ``math``: the kernel PyTorch's CUDA SDPA picks (module
    docstring) for these 4-d inputs on a GPU of ``capability`` (major, minor)."""
    d_q, d_k, d_v = query.shape[-1], key.shape[-1], value.shape[-1]
    dtype = query.dtype
    flash = ((8, 0) <= capability <= (12, 1) and dtype in _HALF and not has_mask
             and d_q == d_k == d_v and d_q <= 256
             and not (is_causal and query.shape[-2] != key.shape[-2]))
    if flash and ((8, 6) <= capability <= (8, 9) or (12, 0) <= capability <= (12, 1)) \
            and training and not (d_q <= 192 or (dropout_p == 0 and d_q > 224)):
        flash = False
    if flash:
        return "flash"
    align = _gemm_alignment(dtype, capability)
    dtypes = (torch.float16, torch.float32) + ((torch.bfloat16,) if capability >= (8, 0)
                                               else ())
    if ((5, 0) <= capability <= (12, 1) and dtype in dtypes and d_q == d_k
            and d_q % align == 0 and d_v % align == 0 and d_q > 0 and d_v > 0):
        return "efficient"
    return "math"


def fused_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False, capability=DEFAULT_CAPABILITY,
                    chosen: Optional[Dict[str, int]] = None):
    """``F.scaled_dot_product_attention`` through the kernel CUDA picks on a GPU of
    ``capability`` (module docstring); the same result shape. ``chosen`` counts the kernels."""
    if key.shape[-3] != query.shape[-3]:  # grouped-query attention: one k/v per query head
        repeat = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(repeat, dim=-3)
        value = value.repeat_interleave(repeat, dim=-3)
    grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (query, key, value) if t is not None)
    kind = select_kernel(query, key, value, attn_mask is not None, dropout_p, is_causal,
                         capability, grad)
    if chosen is not None:
        chosen[kind] = chosen.get(kind, 0) + 1
    if kind == "flash":
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, scale=scale)[0]
    if kind == "efficient":
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, _bias(attn_mask, query, key), grad, dropout_p, is_causal,
            scale=scale)[0]
    return torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale)[0]


def _dropout(input, p=0.5, training=True, inplace=False):
    """``F.dropout`` as ATen's ``dropout`` runs it on a CUDA tensor (module docstring)."""
    if _ACTIVE and training and not inplace and 0 < p < 1 and input.numel() > 0:
        return torch.native_dropout(input, p, True)[0]
    return _ORIGINAL_DROPOUT(input, p, training, inplace)


def _sdpa(query, *args, **kwargs):
    if query.dim() == 4 and _ACTIVE:
        return _ACTIVE[-1].attention(query, *args, **kwargs)
    return _ORIGINAL(query, *args, **kwargs)


_ORIGINAL = F.scaled_dot_product_attention
_ORIGINAL_DROPOUT = F.dropout
_ACTIVE: list = []  # the GpuAttention modes entered, innermost last


class GpuAttention(TorchFunctionMode):
    """Within: every 4-d ``F.scaled_dot_product_attention`` runs :func:`fused_attention` for a
    GPU of ``capability`` (``(major, minor)``; default sm80); :attr:`chosen` counts the kernels;
    ``F.dropout`` runs CUDA's fused ``native_dropout`` (module docstring).

    A torch-function mode catches every call (fx graphs hold the function itself), but the
    autograd engine does not carry it into the recomputation of ``torch.utils.checkpoint``, so
    the module attributes ``torch.nn.functional.scaled_dot_product_attention`` and ``dropout``
    are replaced too
    (what HF and Slapo's op library call, also when recomputing). A traced graph recomputed
    under checkpointing would still run the CPU kernel there: checkpointing then raises its
    ``CheckpointError`` (a different number of saved tensors), never a silent mix."""

    def __init__(self, capability: Tuple[int, int] = DEFAULT_CAPABILITY) -> None:
        super().__init__()
        self.capability = tuple(capability)
        self.chosen: Dict[str, int] = {}
        self.attention = functools.partial(fused_attention, capability=self.capability,
                                           chosen=self.chosen)

    def __enter__(self):
        F.scaled_dot_product_attention = _sdpa
        F.dropout = _dropout
        _ACTIVE.append(self)
        self._slapo = contextlib.ExitStack()
        self._slapo.enter_context(cpu_dropout_kernel(self.attention))
        return super().__enter__()

    def __exit__(self, *exc):
        _ACTIVE.remove(self)
        if not _ACTIVE:
            F.scaled_dot_product_attention = _ORIGINAL
            F.dropout = _ORIGINAL_DROPOUT
        self._slapo.close()
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _ORIGINAL and args and args[0].dim() == 4:
            return self.attention(*args, **kwargs)
        if func is _ORIGINAL_DROPOUT:
            return _dropout(*args, **kwargs)
        return func(*args, **kwargs)
