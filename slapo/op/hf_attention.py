"""Drop-in replacements for HuggingFace (transformers 5) attention modules.

Each adapter is a :class:`~slapo.op.self_attention.SelfAttention` whose ``forward`` takes exactly
the arguments the HF parent layer passes (``hidden_states`` positionally or by name, the rest by
keyword; unknown HF keywords are accepted and ignored) and returns the tuple the parent unpacks.
``from_hf(module)`` copies the weights, so that::

    sch = slapo.create_schedule(model)
    sch["transformer.h.0.attn"].replace(attention_from_hf(sch["transformer.h.0.attn"].mod))

keeps the model's numerics (up to float rounding) while running on SDPA.

Adapters, by family (N = layer index) — the path to replace, then the adapter class:

* BERT / RoBERTa: ``{bert,roberta}.encoder.layer.N.attention.self`` ->
  :class:`HFBertSelfAttention` (no output projection; ``attention.output`` stays HF's);
* ALBERT: ``albert.encoder.albert_layer_groups.0.albert_layers.0.attention`` ->
  :class:`HFAlbertAttention` (includes dense, dropout, residual and LayerNorm);
* GPT-2: ``transformer.h.N.attn`` -> :class:`HFGPT2Attention` (fused QKV by default);
* GPT-Neo: ``transformer.h.N.attn.attention`` -> :class:`HFGPTNeoSelfAttention` (global and
  local layers);
* OPT: ``model.decoder.layers.N.self_attn`` -> :class:`HFOPTAttention`;
* LLaMA: ``model.layers.N.self_attn`` -> :class:`HFLlamaAttention` (RoPE, GQA);
* T5: ``{encoder,decoder}.block.N.layer.0.SelfAttention`` and
  ``decoder.block.N.layer.1.EncDecAttention`` -> :class:`~.hf_t5_attention.HFT5Attention`.

Parameter names change (``query`` / ``c_attn`` / ``o_proj`` ... become ``q_proj``, ``k_proj``,
``v_proj`` or ``qkv_proj``, and ``out_proj``); :func:`~slapo.op.self_attention.split_qkv` maps a
fused weight or gradient back, and every adapter records that mapping on the new module
(:mod:`slapo.provenance`), so ``slapo.verify`` compares them with the HF parameters. KV caches
passed by HF (``cache`` / ``layer_past``) are updated as HF does. ``output_attentions=True``
cannot be honoured by SDPA; the weights slot is ``None``.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import nn

from ..errors import OpError
from ..provenance import record_provenance
from .hf_adapter import HFAdapter, cache_arg, class_names, kv_cache_update, weight_bias, \
    warn_attention_weights
from .hf_t5_attention import HFT5Attention

__all__ = [
    "attention_from_hf", "HFBertSelfAttention", "HFAlbertAttention", "HFGPT2Attention",
    "HFGPTNeoSelfAttention", "HFOPTAttention", "HFLlamaAttention",
]

Out = Tuple[torch.Tensor, None]


class HFBertSelfAttention(HFAdapter):
    """For ``BertSelfAttention`` / ``RobertaSelfAttention`` (no output projection: that lives in
    ``attention.output``). Returns ``(context, None)``."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                cache: Any = None, **kwargs: Any) -> Out:
        if kwargs.get("encoder_hidden_states") is not None:
            raise OpError("cross attention (encoder_hidden_states) is not supported by the BERT "
                          "self-attention adapter", call="HFBertSelfAttention.forward",
                          hint="replace only self-attention modules")
        update = kv_cache_update(cache_arg(cache, kwargs), self.layer_idx)
        return self.attend(hidden_states, attention_mask, kv_update=update), None

    @classmethod
    def from_hf(cls, hf: nn.Module, *, fused_qkv: bool = False,
                backend: str = "auto") -> "HFBertSelfAttention":
        return cls._build(
            hf, {"q": weight_bias(hf.query), "k": weight_bias(hf.key), "v": weight_bias(hf.value)},
            hidden_size=hf.query.in_features, num_heads=hf.num_attention_heads,
            head_dim=hf.attention_head_size, bias=hf.query.bias is not None,
            fused_qkv=fused_qkv, output_proj=False, causal=bool(hf.is_causal),
            scale=hf.scaling, attn_dropout=hf.dropout.p, backend=backend,
            layer_idx=hf.layer_idx)


class HFAlbertAttention(HFAdapter):
    """For ``AlbertAttention``, which also holds the output projection, dropout, residual and
    LayerNorm: ``LayerNorm(x + dropout(out_proj(attention(x))))``. Returns ``(out, None)``."""

    def __init__(self, *args: Any, layer_norm_eps: float = 1e-12, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.layer_norm = nn.LayerNorm(self.hidden_size, eps=layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                **kwargs: Any) -> Out:
        return self.layer_norm(hidden_states + self.attend(hidden_states, attention_mask)), None

    @classmethod
    def from_hf(cls, hf: nn.Module, *, fused_qkv: bool = False,
                backend: str = "auto") -> "HFAlbertAttention":
        new = cls._build(
            hf, {"q": weight_bias(hf.query), "k": weight_bias(hf.key),
                 "v": weight_bias(hf.value),
                 "out": weight_bias(hf.dense)},
            hidden_size=hf.hidden_size, num_heads=hf.num_attention_heads,
            head_dim=hf.attention_head_size, fused_qkv=fused_qkv, causal=bool(hf.is_causal),
            scale=hf.scaling, attn_dropout=hf.attention_dropout.p,
            resid_dropout=hf.output_dropout.p, backend=backend,
            layer_norm_eps=hf.LayerNorm.eps)
        new.layer_norm.load_state_dict(hf.LayerNorm.state_dict())
        for t in ("weight", "bias"):
            record_provenance(new, f"LayerNorm.{t}", f"layer_norm.{t}")
        return new


class HFGPT2Attention(HFAdapter):
    """For ``GPT2Attention`` (self attention; Conv1D ``c_attn`` is the fused ``[in, 3H]``
    weight, transposed and re-laid here). Returns ``(out, None)``."""

    def forward(self, hidden_states: torch.Tensor, cache: Any = None,
                attention_mask: Optional[torch.Tensor] = None,
                encoder_hidden_states: Optional[torch.Tensor] = None,
                encoder_attention_mask: Optional[torch.Tensor] = None,
                output_attentions: Optional[bool] = False, **kwargs: Any) -> Out:
        if encoder_hidden_states is not None:
            raise OpError("GPT-2 cross attention is not supported by this adapter",
                          call="HFGPT2Attention.forward", hint="replace only `attn` modules")
        warn_attention_weights(output_attentions)
        kwargs.pop("use_cache", None)
        update = kv_cache_update(cache_arg(cache, kwargs), self.layer_idx)
        return self.attend(hidden_states, attention_mask, kv_update=update), None

    @classmethod
    def from_hf(cls, hf: nn.Module, *, fused_qkv: bool = True,
                backend: str = "auto") -> "HFGPT2Attention":
        if getattr(hf, "is_cross_attention", False):
            raise OpError("GPT-2 cross attention (crossattention) is not supported",
                          call="HFGPT2Attention.from_hf", module=hf,
                          hint="replace the `attn` modules only")
        h = hf.embed_dim
        w, b = hf.c_attn.weight.t(), hf.c_attn.bias  # Conv1D: [in, 3H] -> Linear [3H, in]
        weights = {"q": (w[:h], b[:h]), "k": (w[h:2 * h], b[h:2 * h]),
                   "v": (w[2 * h:], b[2 * h:]), "out": (hf.c_proj.weight.t(), hf.c_proj.bias)}
        return cls._build(hf, weights, fused_conv1d="c_attn", names={"out": "c_proj"},
                          hidden_size=h, num_heads=hf.num_heads, fused_qkv=fused_qkv,
                          causal=True, scale=hf.scaling, attn_dropout=hf.attn_dropout.p,
                          resid_dropout=hf.resid_dropout.p, backend=backend,
                          layer_idx=hf.layer_idx)


class HFGPTNeoSelfAttention(HFAdapter):
    """For ``GPTNeoSelfAttention`` (global or local; unscaled scores; the local window comes
    from ``config.window_size``). Returns ``(out, None)``."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                layer_past: Any = None, use_cache: bool = False,
                output_attentions: bool = False, **kwargs: Any) -> Out:
        warn_attention_weights(output_attentions)
        update = kv_cache_update(layer_past, self.layer_idx)
        return self.attend(hidden_states, attention_mask, kv_update=update), None

    @classmethod
    def from_hf(cls, hf: nn.Module, *, fused_qkv: bool = False,
                backend: str = "auto") -> "HFGPTNeoSelfAttention":
        local = hf.attention_type == "local"
        return cls._build(
            hf, {"q": weight_bias(hf.q_proj), "k": weight_bias(hf.k_proj),
                 "v": weight_bias(hf.v_proj),
                 "out": weight_bias(hf.out_proj)},
            hidden_size=hf.embed_dim, num_heads=hf.num_heads, bias=False, out_bias=True,
            fused_qkv=fused_qkv, causal=True,
            window_size=hf.config.window_size if local else None, scale=1.0,
            attn_dropout=hf.attn_dropout.p, resid_dropout=hf.resid_dropout.p,
            backend=backend, layer_idx=hf.layer_id)


class HFOPTAttention(HFAdapter):
    """For ``OPTAttention`` (HF scales the query projection; here SDPA applies the same scale).
    Returns ``(out, None)``."""

    def forward(self, hidden_states: torch.Tensor, cache: Any = None,
                attention_mask: Optional[torch.Tensor] = None, output_attentions: bool = False,
                **kwargs: Any) -> Out:
        warn_attention_weights(output_attentions)
        update = kv_cache_update(cache_arg(cache, kwargs), self.layer_idx)
        return self.attend(hidden_states, attention_mask, kv_update=update), None

    @classmethod
    def from_hf(cls, hf: nn.Module, *, fused_qkv: bool = False,
                backend: str = "auto") -> "HFOPTAttention":
        return cls._build(
            hf, {"q": weight_bias(hf.q_proj), "k": weight_bias(hf.k_proj),
                 "v": weight_bias(hf.v_proj),
                 "out": weight_bias(hf.out_proj)},
            hidden_size=hf.embed_dim, num_heads=hf.num_heads, bias=bool(hf.enable_bias),
            fused_qkv=fused_qkv, causal=True, scale=hf.scaling,
            attn_dropout=float(hf.dropout), backend=backend, layer_idx=hf.layer_idx)


class HFLlamaAttention(HFAdapter):
    """For ``LlamaAttention``: rotary ``position_embeddings=(cos, sin)`` from the model's
    ``rotary_emb``, grouped-query attention. Returns ``(out, None)``."""

    def forward(self, hidden_states: torch.Tensor,
                position_embeddings: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
                attention_mask: Optional[torch.Tensor] = None, cache: Any = None,
                **kwargs: Any) -> Out:
        if position_embeddings is None:
            raise OpError("LLaMA attention needs position_embeddings=(cos, sin)",
                          call="HFLlamaAttention.forward",
                          hint="call it from LlamaDecoderLayer, which passes the rotary cos/sin")
        update = kv_cache_update(cache_arg(cache, kwargs), self.layer_idx)
        return self.attend(hidden_states, attention_mask, position_embeddings=position_embeddings,
                           kv_update=update), None

    @classmethod
    def from_hf(cls, hf: nn.Module, *, fused_qkv: bool = False,
                backend: str = "auto") -> "HFLlamaAttention":
        d = hf.head_dim
        return cls._build(
            hf, {"q": weight_bias(hf.q_proj), "k": weight_bias(hf.k_proj),
                 "v": weight_bias(hf.v_proj),
                 "out": weight_bias(hf.o_proj)},
            hidden_size=hf.q_proj.in_features, num_heads=hf.q_proj.out_features // d,
            num_kv_heads=hf.k_proj.out_features // d, head_dim=d,
            bias=hf.q_proj.bias is not None, out_bias=hf.o_proj.bias is not None,
            fused_qkv=fused_qkv, causal=True, scale=hf.scaling,
            attn_dropout=float(hf.attention_dropout), backend=backend, layer_idx=hf.layer_idx)


_ADAPTERS = {
    "BertSelfAttention": HFBertSelfAttention, "RobertaSelfAttention": HFBertSelfAttention,
    "AlbertAttention": HFAlbertAttention, "GPT2Attention": HFGPT2Attention,
    "GPTNeoSelfAttention": HFGPTNeoSelfAttention, "OPTAttention": HFOPTAttention,
    "LlamaAttention": HFLlamaAttention,
}


def attention_from_hf(module: nn.Module, *, fused_qkv: Optional[bool] = None,
                      backend: str = "auto") -> HFAdapter:
    """The slapo attention that replaces HF attention ``module``, with its weights copied.

    Args:
        fused_qkv: use one fused ``qkv_proj`` (layout in :mod:`slapo.op.self_attention`);
            ``None`` keeps the HF module's choice (fused for GPT-2 only).
        backend: the SDPA kernel (:data:`slapo.op.attention.BACKENDS`).

    Raises:
        OpError: ``module`` is not a supported HF attention module (the table in this module's
            docs), or is a cross-attention variant the adapter does not cover.
    """
    names = class_names(module)
    if "T5Attention" in names:
        return HFT5Attention.from_hf(module, fused_qkv=bool(fused_qkv), backend=backend)
    for name, adapter in _ADAPTERS.items():
        if name in names:
            kwargs = {} if fused_qkv is None else {"fused_qkv": fused_qkv}
            return adapter.from_hf(module, backend=backend, **kwargs)
    supported = ", ".join(sorted({*_ADAPTERS, "T5Attention"}))
    raise OpError(f"no slapo attention adapter for {type(module).__name__}",
                  call="attention_from_hf", module=module,
                  hint=f"supported HF modules: {supported}; for GPT-Neo replace "
                  "'...attn.attention', for BERT '...attention.self'")
