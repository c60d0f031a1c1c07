"""The shared part of the HuggingFace attention adapters (:mod:`slapo.op.hf_attention`,
:mod:`slapo.op.hf_t5_attention`): construction from a HF module with its weights copied and its
provenance recorded, the KV-cache hook, and the argument conventions of transformers 5."""

from __future__ import annotations

import warnings
from typing import Any, Optional, Tuple

import torch
from torch import nn

from ..errors import OpError
from .hf_provenance import linear_names, record_attention
from .self_attention import KVUpdate, SelfAttention, fuse_qkv

__all__ = ["HFAdapter", "copy_projections", "kv_cache_update", "cache_arg", "weight_bias",
           "class_names", "warn_attention_weights"]


def class_names(module: nn.Module) -> set:
    """Names of the classes ``module`` is an instance of (subclasses of HF classes match)."""
    return {c.__name__ for c in type(module).__mro__}


def kv_cache_update(cache: Any, layer_idx: Optional[int], *, cross: bool = False,
                    **cache_kwargs: Any) -> Optional[KVUpdate]:
    """A ``kv_update`` hook for a HF cache (``DynamicCache``, ``EncoderDecoderCache`` ...), or
    ``None`` without a cache. Cross attention reuses keys/values already cached for the layer."""
    if cache is None:
        return None
    if layer_idx is None:
        raise OpError("a KV cache was passed but the attention module has no layer_idx",
                      call="attention forward", hint="build it with from_hf(...) or layer_idx=")
    enc_dec = hasattr(cache, "self_attention_cache") and hasattr(cache, "cross_attention_cache")
    current = (cache.cross_attention_cache if cross else cache.self_attention_cache) \
        if enc_dec else cache
    if getattr(current, "is_compileable", False) and not cross:
        raise OpError(
            f"a {type(current).__name__} (pre-allocated, fixed-length KV cache) was passed; "
            "slapo's attention aligns causal masks to the end of the keys, which is wrong for "
            "a cache whose unfilled slots come after the tokens", call="attention forward",
            hint="generate with a DynamicCache (the default: do not pass "
            "cache_implementation='static')")
    if cross and enc_dec and cache.is_updated.get(layer_idx):
        layer = current.layers[layer_idx]
        return lambda k, v: (layer.keys, layer.values)

    def update(k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        k, v = current.update(k, v, layer_idx, kwargs=cache_kwargs)
        if cross and enc_dec:
            cache.is_updated[layer_idx] = True
        return k, v

    return update


def warn_attention_weights(output_attentions: Optional[bool]) -> None:
    if output_attentions:
        warnings.warn("slapo.op attention runs on SDPA and cannot return attention weights; "
                      "returning None for them", stacklevel=3)


def cache_arg(cache: Any, kwargs: dict) -> Any:
    """HF 5 renames ``past_key_values`` to ``cache``; accept both."""
    return cache if cache is not None else kwargs.pop("past_key_values", None)


class HFAdapter(SelfAttention):
    """Shared construction: build with ``options``, copy q/k/v/out weights, match device,
    dtype and training mode of the HF module."""

    @classmethod
    def _build(cls, hf: nn.Module, weights: dict, *, fused_conv1d: Optional[str] = None,
               names: Optional[dict] = None, **options: Any) -> "HFAdapter":
        """``fused_conv1d``: the HF child holding q/k/v as one Conv1D (GPT-2's ``c_attn``);
        ``names`` ({"out": "c_proj"}): HF children of entries of ``weights`` that are views;
        the others are found by identity. They go into the provenance record
        (:mod:`slapo.op.hf_provenance`) that ``slapo.verify`` reads."""
        ref = weights["q"][0]
        with torch.device(ref.device):
            new = cls(**options)
        new.to(ref.dtype)
        copy_projections(new, weights)
        record_attention(new, hf, {**linear_names(hf, weights), **(names or {})},
                         fused_conv1d=fused_conv1d)
        return new.train(hf.training)


def copy_projections(new: SelfAttention, weights: dict) -> None:
    """Copy ``weights`` (``{"q": (W, b), "k": ..., "v": ..., "out": ...}``, Linear layout
    ``[out, in]``, ``b`` may be ``None``) into ``new``, fusing q/k/v if ``new`` is fused."""
    with torch.no_grad():
        (qw, qb), (kw, kb), (vw, vb) = weights["q"], weights["k"], weights["v"]
        if new.fused_qkv:
            args = (new.num_heads, new.num_kv_heads, new.head_dim)
            new.qkv_proj.weight.copy_(fuse_qkv(qw, kw, vw, *args))
            if qb is not None:
                new.qkv_proj.bias.copy_(fuse_qkv(qb, kb, vb, *args))
        else:
            for lin, (w, b) in ((new.q_proj, (qw, qb)), (new.k_proj, (kw, kb)),
                                (new.v_proj, (vw, vb))):
                lin.weight.copy_(w)
                if b is not None:
                    lin.bias.copy_(b)
        if "out" in weights:
            w, b = weights["out"]
            out = new.out_proj
            assert out is not None, "weights name an output projection the module was built without"
            out.weight.copy_(w)
            if b is not None:
                out.bias.copy_(b)


def weight_bias(m: nn.Linear) -> tuple:
    return m.weight, m.bias
