"""An HF-style multi-head attention layer: projections, core attention, output projection.

:class:`SelfAttention` projects ``hidden_states [B, S, hidden]`` to q/k/v (three Linears, or one
fused Linear), optionally applies rotary position embeddings and a KV cache, runs
:class:`~slapo.op.attention.AttentionOp`, merges the heads and applies the output projection and
residual dropout. The family adapters in :mod:`slapo.op.hf_attention` give it the exact calling
convention of each HuggingFace attention module.

Fused QKV layout (``fused_qkv=True``, one ``qkv_proj = Linear(hidden, (H + 2*Hkv) * D)``): the
output features are **grouped by kv head**. With ``r = H // Hkv`` query heads per kv head, the
rows of ``qkv_proj.weight`` are ``Hkv`` consecutive blocks of ``(r + 2) * D`` rows::

    block g = [ q head g*r | q head g*r+1 | ... | q head g*r+r-1 | k head g | v head g ]

each entry ``D`` rows (for plain multi-head attention, ``r = 1``: ``[q_0 k_0 v_0 | q_1 k_1 v_1
| ...]``). Query head ``h`` attends with kv head ``h // r`` (as in SDPA's GQA and HF). Sharding
the weight (and bias) on axis 0 over ``W`` ranks, ``W`` dividing ``Hkv``, therefore hands every
rank ``Hkv / W`` whole groups: its q heads are the contiguous block ``[rank*H/W, (rank+1)*H/W)``,
exactly the input columns of ``out_proj`` that an axis-1 (row-parallel) shard gives the same
rank. :func:`fuse_qkv` / :func:`split_qkv` convert between this layout and separate q/k/v tensors.

Tensor parallelism: ``num_heads`` / ``num_kv_heads`` are the *local* head counts, to be divided
by the TP rule that shards the projections. The forward derives the head counts from the
projected tensors' shapes (only ``head_dim`` and the ratio ``r`` are fixed), so it stays correct
on a shard either way.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
from torch import nn

from ..errors import OpError
from .attention import AttentionOp, check_backend

__all__ = ["SelfAttention", "fuse_qkv", "split_qkv", "apply_rotary", "rotate_half"]

KVUpdate = Callable[[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]


def _groups(num_heads: int, num_kv_heads: int, call: str) -> int:
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise OpError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}",
                      call=call, hint="every kv head must serve the same number of query heads")
    return num_heads // num_kv_heads


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int,
             num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """Separate q ``[H*D, ...]``, k, v ``[Hkv*D, ...]`` (Linear weights or biases, head-major
    rows) -> one tensor in the grouped fused-QKV layout (module docs)."""
    r = _groups(num_heads, num_kv_heads, "fuse_qkv")
    rest = q.shape[1:]
    qg = q.reshape(num_kv_heads, r, head_dim, *rest)
    kg = k.reshape(num_kv_heads, 1, head_dim, *rest)
    vg = v.reshape(num_kv_heads, 1, head_dim, *rest)
    return torch.cat([qg, kg, vg], dim=1).reshape(-1, *rest)


def split_qkv(fused: torch.Tensor, num_heads: int, num_kv_heads: int,
              head_dim: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_qkv` (also handy for gradients and checkpoint conversion)."""
    r = _groups(num_heads, num_kv_heads, "split_qkv")
    rest = fused.shape[1:]
    g = fused.reshape(num_kv_heads, r + 2, head_dim, *rest)
    return (g[:, :r].reshape(-1, *rest), g[:, r].reshape(-1, *rest),
            g[:, r + 1].reshape(-1, *rest))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dimension (the "rotate half" RoPE convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of ``q, k [B, H, S, D]`` with ``cos, sin [B|1, S, D]`` (as
    LLaMA's ``rotary_emb`` produces them)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class SelfAttention(nn.Module):
    """Multi-head (optionally grouped-query, local, cross) attention with HF-style projections.

    Args:
        hidden_size: model width (input of the projections, output of ``out_proj``).
        num_heads: query heads; ``num_kv_heads`` (default ``num_heads``) key/value heads.
        head_dim: per-head size (default ``hidden_size // num_heads``).
        bias: bias of the q/k/v projections; ``out_bias`` of ``out_proj`` (default ``bias``).
        fused_qkv: one ``qkv_proj`` Linear in the grouped layout (module docs) instead of
            ``q_proj``/``k_proj``/``v_proj``. Not with ``cross_attention``.
        output_proj: add ``out_proj`` (BERT's self-attention has none; its projection is in
            ``BertSelfOutput``).
        causal, window_size, scale, backend: of the core op (:func:`slapo.op.attention`).
        attn_dropout: dropout on the attention probabilities; ``resid_dropout`` on the output.
            Both only in training mode.
        cross_attention: keys/values come from ``key_value_states`` (width ``kv_size``,
            default ``hidden_size``).
        layer_idx: this layer's index in a KV cache.
    """

    def __init__(self, hidden_size: int, num_heads: int, *, num_kv_heads: Optional[int] = None,
                 head_dim: Optional[int] = None, bias: bool = True,
                 out_bias: Optional[bool] = None, fused_qkv: bool = False,
                 output_proj: bool = True, causal: bool = False,
                 window_size: Optional[int] = None, scale: Optional[float] = None,
                 attn_dropout: float = 0.0, resid_dropout: float = 0.0,
                 backend: str = "auto", cross_attention: bool = False,
                 kv_size: Optional[int] = None, layer_idx: Optional[int] = None):
        super().__init__()
        call = "SelfAttention"
        check_backend(backend, call)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.groups = _groups(num_heads, num_kv_heads, call)
        if head_dim is None:
            if hidden_size % num_heads:
                raise OpError(f"hidden_size={hidden_size} is not divisible by "
                              f"num_heads={num_heads}", call=call,
                              hint="pass head_dim explicitly if the heads do not tile the width")
            head_dim = hidden_size // num_heads
        if fused_qkv and cross_attention:
            raise OpError("a fused QKV projection cannot take keys/values from another sequence",
                          call=call, hint="use fused_qkv=False for cross attention")
        self.hidden_size, self.head_dim = hidden_size, head_dim
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.fused_qkv, self.cross_attention = fused_qkv, cross_attention
        self.layer_idx = layer_idx
        q_out, kv_out = num_heads * head_dim, num_kv_heads * head_dim
        kv_in = kv_size if kv_size is not None else hidden_size
        if fused_qkv:
            self.qkv_proj = nn.Linear(hidden_size, q_out + 2 * kv_out, bias=bias)
        else:
            self.q_proj = nn.Linear(hidden_size, q_out, bias=bias)
            self.k_proj = nn.Linear(kv_in, kv_out, bias=bias)
            self.v_proj = nn.Linear(kv_in, kv_out, bias=bias)
        self.attn_op = AttentionOp(causal=causal, dropout=attn_dropout, scale=scale,
                                   window_size=window_size, backend=backend)
        out_bias = bias if out_bias is None else out_bias
        self.out_proj = nn.Linear(q_out, hidden_size, bias=out_bias) if output_proj else None
        self.resid_dropout = nn.Dropout(resid_dropout)

    # ------------------------------------------------------------------ pieces
    def project_qkv(self, hidden_states: torch.Tensor,
                    key_value_states: Optional[torch.Tensor] = None
                    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``[B, H, S, D]`` and k, v ``[B, Hkv, S_kv, D]`` (head counts from the shapes)."""
        b, s = hidden_states.shape[:2]
        d, r = self.head_dim, self.groups
        if self.fused_qkv:
            if key_value_states is not None:
                raise OpError("key_value_states given to a fused-QKV attention",
                              call="SelfAttention.forward",
                              hint="build the module with fused_qkv=False for cross attention")
            x = self.qkv_proj(hidden_states).view(b, s, -1, r + 2, d)
            # one split (its backward is one cat), not three slices (whose backward fills and
            # adds three zero tensors of the fused size)
            q, k, v = torch.split(x, [r, 1, 1], dim=3)
            q = q.reshape(b, s, -1, d)
            return q.transpose(1, 2), k.squeeze(3).transpose(1, 2), v.squeeze(3).transpose(1, 2)
        kv_in = hidden_states if key_value_states is None else key_value_states
        kv_shape = (*kv_in.shape[:2], -1, d)
        q = self.q_proj(hidden_states).view(b, s, -1, d).transpose(1, 2)
        k = self.k_proj(kv_in).view(kv_shape).transpose(1, 2)
        v = self.v_proj(kv_in).view(kv_shape).transpose(1, 2)
        return q, k, v

    def attend(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
               *, key_value_states: Optional[torch.Tensor] = None,
               position_embeddings: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
               kv_update: Optional[KVUpdate] = None) -> torch.Tensor:
        """The whole layer: ``[B, S, hidden] -> [B, S, hidden]``.

        ``position_embeddings`` are rotary ``(cos, sin)``; ``kv_update(k, v) -> (k, v)`` hooks
        in a KV cache (it sees post-rotary keys and returns the keys/values to attend over).
        """
        q, k, v = self.project_qkv(hidden_states, key_value_states)
        if position_embeddings is not None:
            q, k = apply_rotary(q, k, *position_embeddings)
        if kv_update is not None:
            k, v = kv_update(k, v)
        ctx = self.attn_op(q, k, v, attention_mask)
        out = ctx.transpose(1, 2).reshape(*hidden_states.shape[:2], -1)
        if self.out_proj is not None:
            out = self.out_proj(out)
        return self.resid_dropout(out)

    def forward(self, hidden_states: torch.Tensor,
                attention_mask: Optional[torch.Tensor] = None,
                key_value_states: Optional[torch.Tensor] = None,
                position_embeddings: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
                ) -> torch.Tensor:
        """``hidden_states [B, S, hidden] -> [B, S, hidden]`` (see :meth:`attend`)."""
        return self.attend(hidden_states, attention_mask, key_value_states=key_value_states,
                           position_embeddings=position_embeddings)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, "
                f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                f"fused_qkv={self.fused_qkv}")
