"""Provenance records (:mod:`slapo.provenance`) of the op-library modules built from HF modules:
which HF parameter each new parameter holds, and how to lay it out as HF did.

* attention (:func:`record_attention`): separate HF q/k/v/out Linears (``query`` ...,
  ``q_proj`` ..., T5's ``q`` ...) -> ``q_proj``/``k_proj``/``v_proj`` (renamed) or the fused
  ``qkv_proj`` (split back with :func:`~slapo.op.self_attention.split_qkv`); GPT-2's Conv1D
  ``c_attn`` ``[in, 3H]`` and ``c_proj`` (transposed);
* MLP (:func:`record_linear`): GPT-2 / GPT-Neo ``c_fc``/``c_proj`` -> ``fc_in``/``fc_out``.

Head counts are captured at build time (before any sharding), so the split applies to the
gathered, full fused tensor.
"""

from __future__ import annotations

from functools import partial
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from ..provenance import concat, record_provenance, same, transposed
from .self_attention import SelfAttention, split_qkv

__all__ = ["record_attention", "record_linear", "qkv_part", "qkv_concat", "linear_names"]


def qkv_part(fused: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
             index: int) -> torch.Tensor:
    """q (0), k (1) or v (2) of a fused grouped-QKV tensor."""
    return split_qkv(fused, num_heads, num_kv_heads, head_dim)[index]


def qkv_concat(fused: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
               transpose: bool = False) -> torch.Tensor:
    """``[q | k | v]`` blocks of a fused grouped-QKV tensor (GPT-2's ``c_attn`` order),
    transposed after with ``transpose`` (Conv1D weight)."""
    return concat(*split_qkv(fused, num_heads, num_kv_heads, head_dim), transpose=transpose)


def linear_names(hf: nn.Module, weights: Dict[str, Tuple]) -> Dict[str, str]:
    """``{"q": "query", ...}``: the HF child owning each ``weights[key][0]`` (found by identity;
    entries that are views, not parameters of ``hf``, are left out)."""
    owners = {id(p): name for name, p in hf.named_parameters()}
    out = {}
    for key, (w, _) in weights.items():
        name = owners.get(id(w), "")
        if name.endswith(".weight"):
            out[key] = name[: -len(".weight")]
    return out


def _has(mod: nn.Module, name: str) -> bool:
    return name in dict(mod.named_parameters())


def record_linear(new: nn.Module, new_child: str, hf: nn.Module, hf_child: str) -> None:
    """``hf_child.{weight,bias}`` (a Linear, or a Conv1D: weight transposed) is
    ``new_child.{weight,bias}`` (Linear layout)."""
    conv1d = type(getattr(hf, hf_child)).__name__ == "Conv1D"
    for t in ("weight", "bias"):
        if _has(hf, f"{hf_child}.{t}") and _has(new, f"{new_child}.{t}"):
            fn = transposed if conv1d and t == "weight" else same
            record_provenance(new, f"{hf_child}.{t}", f"{new_child}.{t}", fn)


def record_attention(new: SelfAttention, hf: nn.Module, names: Dict[str, str], *,
                     fused_conv1d: Optional[str] = None) -> None:
    """Record where ``new``'s projections come from: ``names`` maps ``"q"``, ``"k"``, ``"v"``,
    ``"out"`` to HF child names (Linear or Conv1D); ``fused_conv1d`` names GPT-2's fused
    ``c_attn`` instead of separate q/k/v."""
    heads = dict(num_heads=new.num_heads, num_kv_heads=new.num_kv_heads, head_dim=new.head_dim)
    for t in ("weight", "bias"):
        if fused_conv1d is not None:
            if not _has(hf, f"{fused_conv1d}.{t}"):
                continue
            tr = t == "weight"
            if new.fused_qkv:
                fn = partial(qkv_concat, transpose=tr, **heads)
                record_provenance(new, f"{fused_conv1d}.{t}", f"qkv_proj.{t}", fn)
            else:
                record_provenance(new, f"{fused_conv1d}.{t}",
                                  [f"{p}_proj.{t}" for p in "qkv"], partial(concat, transpose=tr))
            continue
        for i, p in enumerate("qkv"):
            child = names.get(p)
            if child is None or not _has(hf, f"{child}.{t}"):
                continue
            if new.fused_qkv:
                record_provenance(new, f"{child}.{t}", f"qkv_proj.{t}",
                                  partial(qkv_part, index=i, **heads))
            else:
                record_provenance(new, f"{child}.{t}", f"{p}_proj.{t}", same)
    if names.get("out") is not None and getattr(new, "out_proj", None) is not None:
        record_linear(new, "out_proj", hf, names["out"])
