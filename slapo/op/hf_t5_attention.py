"""Drop-in replacement for HuggingFace T5 attention (self, causal decoder self, and cross).

T5 differs from the other families in three ways, all kept here:

* scores are **not scaled** (``scale=1.0``);
* a learned **relative position bias** ``[1, H, Q, K]`` (an ``Embedding(num_buckets, H)`` over
  bucketed key-minus-query distances; bidirectional buckets in the encoder, causal ones in the
  decoder) is added to the scores. Only the first block of each stack owns the embedding; it
  returns the bias, and the stack passes it to every later layer as ``position_bias``;
* the forward returns ``(out, position_bias, attn_weights)``.

The bias is combined with the mask into one additive SDPA mask; under tensor parallelism the bias
embedding is sharded on its head axis (axis 1) like the projections.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import torch
from torch import nn

from .hf_adapter import HFAdapter, cache_arg, kv_cache_update, weight_bias

__all__ = ["HFT5Attention", "relative_position_bucket"]


def relative_position_bucket(relative_position: torch.Tensor, *, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's bucket of each ``key - query`` distance.

    Half of the buckets (of each direction when bidirectional) hold exact distances
    ``0 .. n/2 - 1``; the rest cover ``n/2 .. max_distance`` logarithmically, and everything
    farther shares the last bucket. Causal (``bidirectional=False``) maps future keys to 0.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    exact = num_buckets // 2
    # log-spaced buckets for distances >= exact (the clamp only avoids log(0) on the exact ones)
    log_ratio = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    far = exact + (log_ratio * (num_buckets - exact)).long()
    far = far.clamp(max=num_buckets - 1)
    return buckets + torch.where(distance < exact, distance, far)


class HFT5Attention(HFAdapter):
    """For ``T5Attention`` in any of its three roles (the role follows the call: cross attention
    when ``key_value_states`` is given). Returns ``(out, position_bias, None)``."""

    def __init__(self, *args: Any, relative_attention: bool = False, is_decoder: bool = False,
                 num_buckets: int = 32, max_distance: int = 128, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.is_decoder = is_decoder
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.relative_attention_bias = (nn.Embedding(num_buckets, self.num_heads)
                                        if relative_attention else None)

    def compute_bias(self, q_len: int, k_len: int, past: int = 0) -> torch.Tensor:
        """The relative position bias ``[1, H, q_len, k_len]`` (queries start at ``past``)."""
        weight = self.relative_attention_bias.weight
        q_pos = torch.arange(past, past + q_len, device=weight.device)[:, None]
        k_pos = torch.arange(k_len, device=weight.device)[None, :]
        bucket = relative_position_bucket(k_pos - q_pos, bidirectional=not self.is_decoder,
                                          num_buckets=self.num_buckets,
                                          max_distance=self.max_distance)
        return self.relative_attention_bias(bucket).permute(2, 0, 1).unsqueeze(0)

    def forward(self, hidden_states: torch.Tensor, mask: Optional[torch.Tensor] = None,
                key_value_states: Optional[torch.Tensor] = None,
                position_bias: Optional[torch.Tensor] = None, cache: Any = None,
                **kwargs: Any) -> Tuple[torch.Tensor, Optional[torch.Tensor], None]:
        cache = cache_arg(cache, kwargs)
        cross = key_value_states is not None
        if position_bias is None and self.relative_attention_bias is not None:
            past = 0
            if cache is not None and hasattr(cache, "get_seq_length"):
                past = int(cache.get_seq_length(self.layer_idx))
            k_len = (key_value_states if cross else hidden_states).shape[1] + (0 if cross else past)
            position_bias = self.compute_bias(hidden_states.shape[1], k_len, past)
        attn_mask = mask
        if position_bias is not None:
            if mask is None:
                attn_mask = position_bias
            elif mask.dtype == torch.bool:
                attn_mask = torch.where(mask, position_bias, torch.finfo(position_bias.dtype).min)
            else:
                attn_mask = position_bias + mask
        update = kv_cache_update(cache, self.layer_idx, cross=cross)
        out = self.attend(hidden_states, attn_mask, key_value_states=key_value_states,
                          kv_update=update)
        return out, position_bias, None

    @classmethod
    def from_hf(cls, hf: nn.Module, *, fused_qkv: bool = False,
                backend: str = "auto") -> "HFT5Attention":
        rel = bool(hf.has_relative_attention_bias)
        new = cls._build(
            hf, {"q": weight_bias(hf.q), "k": weight_bias(hf.k),
                 "v": weight_bias(hf.v), "out": weight_bias(hf.o)},
            hidden_size=hf.d_model, num_heads=hf.n_heads, head_dim=hf.key_value_proj_dim,
            bias=False, fused_qkv=fused_qkv, causal=bool(hf.is_causal), scale=1.0,
            attn_dropout=float(hf.dropout), backend=backend, layer_idx=hf.layer_idx,
            relative_attention=rel, is_decoder=bool(hf.is_decoder),
            num_buckets=hf.relative_attention_num_buckets,
            max_distance=hf.relative_attention_max_distance)
        if rel:
            with torch.no_grad():
                new.relative_attention_bias.weight.copy_(hf.relative_attention_bias.weight)
        return new
