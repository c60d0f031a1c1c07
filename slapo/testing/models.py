"""Tiny reference models for tests and docs, built from configs (no downloads).

``tiny_model("bert")`` returns a small, seeded HuggingFace model of the family; ``example_inputs``
returns matching keyword inputs (with labels, so the output has a ``loss``). ``MLP`` is a plain
PyTorch model for the simplest examples.
"""

from __future__ import annotations

import os
from typing import Any, Dict

import torch
from torch import nn

__all__ = ["FAMILIES", "tiny_config", "tiny_model", "example_inputs", "MLP", "seeded",
           "PLAN_FAMILIES", "PLAN_HEADS", "tiny_plan_config", "tiny_plan_model"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")

FAMILIES = ("bert", "roberta", "albert", "gpt2", "gpt_neo", "opt", "t5", "llama")

# Small but structurally complete: >1 layer, >1 head, hidden divisible by 2 and 4 (TP tests).
_COMMON_DROPOUT = 0.0


def tiny_config(family: str, **overrides: Any):
    """A small HF config of ``family`` (see ``FAMILIES``); keyword overrides win."""
    import transformers as tf

    h, heads, layers, vocab, ffn = 32, 4, 2, 128, 64
    d = _COMMON_DROPOUT
    if family in ("bert", "roberta"):
        cls = tf.BertConfig if family == "bert" else tf.RobertaConfig
        kw = dict(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers,
                  num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=64,
                  hidden_dropout_prob=d, attention_probs_dropout_prob=d)
        if family == "roberta":
            kw.update(pad_token_id=1, bos_token_id=0, eos_token_id=2)
    elif family == "albert":
        cls = tf.AlbertConfig
        kw = dict(vocab_size=vocab, embedding_size=16, hidden_size=h, num_hidden_layers=layers,
                  num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=64,
                  hidden_dropout_prob=d, attention_probs_dropout_prob=d, classifier_dropout_prob=d)
    elif family == "gpt2":
        cls = tf.GPT2Config
        kw = dict(vocab_size=vocab, n_embd=h, n_layer=layers, n_head=heads, n_positions=64,
                  n_inner=ffn, resid_pdrop=d, embd_pdrop=d, attn_pdrop=d,
                  bos_token_id=0, eos_token_id=0)
    elif family == "gpt_neo":
        cls = tf.GPTNeoConfig
        kw = dict(vocab_size=vocab, hidden_size=h, num_layers=layers, num_heads=heads,
                  attention_types=[[["global", "local"], layers // 2]], window_size=4,
                  intermediate_size=ffn, max_position_embeddings=64, resid_dropout=d,
                  embed_dropout=d, attention_dropout=d, bos_token_id=0, eos_token_id=0)
    elif family == "opt":
        cls = tf.OPTConfig
        kw = dict(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers,
                  num_attention_heads=heads, ffn_dim=ffn, max_position_embeddings=64,
                  word_embed_proj_dim=h, dropout=d, attention_dropout=d, activation_dropout=d,
                  pad_token_id=1, bos_token_id=0, eos_token_id=2)
    elif family == "t5":
        cls = tf.T5Config
        kw = dict(vocab_size=vocab, d_model=h, d_kv=h // heads, d_ff=ffn, num_layers=layers,
                  num_decoder_layers=layers, num_heads=heads, dropout_rate=d,
                  relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0)
    elif family == "llama":
        cls = tf.LlamaConfig
        kw = dict(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=2, intermediate_size=ffn,
                  max_position_embeddings=64, attention_dropout=d,
                  bos_token_id=0, eos_token_id=0, pad_token_id=0)
    else:
        raise ValueError(f"unknown family {family!r}; choose from {FAMILIES}")
    kw.update(overrides)
    return cls(**kw)


_MODEL_CLASS = {
    "bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM", "albert": "AlbertForMaskedLM",
    "gpt2": "GPT2LMHeadModel", "gpt_neo": "GPTNeoForCausalLM", "opt": "OPTForCausalLM",
    "t5": "T5ForConditionalGeneration", "llama": "LlamaForCausalLM",
}


class seeded:
    """Context manager: ``torch.manual_seed(seed)`` inside, the previous RNG state restored
    after."""

    def __init__(self, seed: int):
        self.seed = seed

    def __enter__(self):
        self.state = torch.get_rng_state()
        torch.manual_seed(self.seed)

    def __exit__(self, *exc):
        torch.set_rng_state(self.state)


def tiny_model(family: str, seed: int = 0, **overrides: Any) -> nn.Module:
    """A seeded tiny HF model of ``family`` in train mode (same seed -> same weights)."""
    import transformers as tf

    config = tiny_config(family, **overrides)
    with seeded(seed):
        model = getattr(tf, _MODEL_CLASS[family])(config)
    return model.train()


def example_inputs(family: str, batch: int = 2, seq: int = 8, seed: int = 0,
                   vocab: int = 128) -> Dict[str, torch.Tensor]:
    """Seeded keyword inputs (with ``labels``) for a tiny model of ``family``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, -2:] = 0  # some padding, so masks matter
    inputs: Dict[str, torch.Tensor] = {"input_ids": ids, "attention_mask": mask}
    if family == "t5":
        inputs["labels"] = torch.randint(3, vocab, (batch, max(2, seq // 2)), generator=g)
    else:
        inputs["labels"] = ids.clone()
    return inputs


class MLP(nn.Module):
    """``fc2(act(fc1(x)))`` with an optional dropout, the smallest schedulable model."""

    def __init__(self, hidden: int = 16, ffn: int = 32, dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.act = nn.GELU()
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.act(self.fc1(x))))


# --- tiny models of every family that declares a tensor-parallel plan ---------------------------

# Generic shrink, by config attribute name: applied to every attribute the family's default config
# has. Sizes divide by 2 and 4 (TP tests); 4 query heads over 2 kv heads keep GQA in play.
_TINY_PLAN_SIZES: Dict[str, Any] = {
    "vocab_size": 128, "unpadded_vocab_size": 128, "hidden_size": 64, "intermediate_size": 64,
    "intermediate_size_mlp": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 64, "original_max_position_embeddings": 64,
    "max_window_layers": 2, "sliding_window": 4, "query_pre_attn_scalar": 16,
    "n_positions": 64, "n_ctx": 64, "rotary_dim": 8,
    # MoE
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_k": 2, "moe_topk": 2, "n_shared_experts": 1,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
    # multi-head latent attention (deepseek)
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    # per-layer inputs, LAuReL, KV sharing (gemma3n)
    "vocab_size_per_layer_input": 128, "hidden_size_per_layer_input": 16, "laurel_rank": 8,
    "num_kv_shared_layers": 0, "num_dense_layers": 1,
}
# Zero every dropout the config has: the scheduled and the reference model must agree exactly.
_DROPOUT_NAMES = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop",
                  "attn_pdrop", "hidden_dropout_prob", "attention_probs_dropout_prob",
                  "dropout", "embedding_dropout", "mlp_dropout", "residual_dropout",
                  "classifier_dropout", "resid_dropout", "embed_dropout", "router_jitter_noise")
_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")

# The families named by issue #27 (plus the earlier llama-likes); any other family with a plan
# builds through the same generic shrink.
PLAN_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma3_text", "phi3", "olmo2",
                 "mixtral", "qwen3_moe", "deepseek_v3")


def _family_fixes(model_type: str, defaults: Dict[str, Any]) -> Dict[str, Any]:
    """Per-family corrections to the generic shrink (only where the generic one breaks)."""
    fixes: Dict[str, Any] = {}
    if "layer_types" in defaults:
        fixes["layer_types"] = None  # re-derived from the new layer count
    layers = defaults.get("num_hidden_layers")
    for name, value in defaults.items():  # other per-layer lists: re-derived too
        if isinstance(value, list) and len(value) == layers and name not in _TINY_PLAN_SIZES:
            fixes[name] = None
    if defaults.get("rope_parameters") == {} and defaults.get("layer_types"):
        # RoPE per layer type with none given (cohere_compass_text's default config)
        fixes["rope_parameters"] = {t: {"rope_type": "default", "rope_theta": 10000.0}
                                    for t in set(defaults["layer_types"])}
    if isinstance(layers, int):  # per-layer settings keyed by layer index
        fixes.update({k: v for k, v in _cut_layer_dicts(
            defaults, _TINY_PLAN_SIZES["num_hidden_layers"]).items()})
    if model_type == "lfm2_moe":  # no layer_types by default, and the model indexes them
        fixes["layer_types"] = ["conv", "full_attention"]
    if "rope_scaling" in defaults and defaults.get("rope_scaling"):
        fixes["rope_scaling"] = None
    if "qk_rope_head_dim" in defaults:  # MLA (DeepSeek): RoPE over head_dim, kv heads = heads
        fixes["head_dim"] = _TINY_PLAN_SIZES["qk_rope_head_dim"]
        fixes["num_key_value_heads"] = _TINY_PLAN_SIZES["num_attention_heads"]
    return fixes


def tiny_plan_config(model_type: str, **overrides: Any):
    """A tiny config of any ``transformers.CONFIG_MAPPING`` family (``model_type``) that declares
    a tensor-parallel plan (``base_model_tp_plan``): hidden 64, 2 layers, 4 heads over 2 kv heads,
    vocab 128, 4 experts (MoE), no dropout; keyword overrides win."""
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"unknown model_type {model_type!r} (not in transformers.CONFIG_MAPPING)")
    cls = CONFIG_MAPPING[model_type]
    defaults = cls().to_dict()
    aliases = dict(getattr(cls, "attribute_map", {}) or {})  # e.g. hidden_size -> n_embd
    kw: Dict[str, Any] = {aliases.get(k, k): v for k, v in _TINY_PLAN_SIZES.items()
                          if aliases.get(k, k) in defaults}
    kw.update({k: 0.0 for k in _DROPOUT_NAMES
               if isinstance(defaults.get(k), float) and not isinstance(defaults.get(k), bool)})
    vocab = kw.get("vocab_size", 128)
    kw.update({k: 0 for k in _TOKEN_IDS
               if isinstance(defaults.get(k), int) and defaults[k] >= vocab})
    if "use_cache" in defaults:
        kw["use_cache"] = False  # training; hybrid linear-attention caches refuse a plain call
    kw.update({k: v for k, v in _family_fixes(model_type, defaults).items() if k in defaults})
    kw.update(_tiny_sub_configs(cls))
    kw.update(overrides)
    dropped = {k for k, v in _family_fixes(model_type, defaults).items() if v is None}
    return cls(**{k: v for k, v in kw.items() if v is not None or k not in dropped})


def _tiny_sub_configs(cls) -> Dict[str, Any]:
    """A composite config's sub-configs (Llama 4's text and vision models, Phi-4-multimodal's
    audio and vision towers) shrunk the same way, as dicts: otherwise the towers keep their
    published sizes (GBs) inside a tiny model."""
    subs: Dict[str, Any] = {}
    names = list((getattr(cls, "sub_configs", None) or {}))
    if not names:
        return subs
    try:
        whole = cls()
    except (TypeError, ValueError, OSError):
        return subs
    for name in names:
        instance = getattr(whole, name, None)  # AutoConfig entries: the default's real class
        if instance is None or not hasattr(instance, "to_dict"):
            continue
        sub = type(instance)
        defaults = instance.to_dict()
        aliases = dict(getattr(sub, "attribute_map", {}) or {})
        tiny = {aliases.get(k, k): v for k, v in _TINY_PLAN_SIZES.items()
                if aliases.get(k, k) in defaults}
        layers, new_layers = defaults.get("num_hidden_layers"), tiny.get("num_hidden_layers")
        if isinstance(layers, int) and new_layers:  # per-layer lists (layer_types ...) cut too
            tiny.update({k: v[:new_layers] for k, v in defaults.items()
                         if isinstance(v, list) and len(v) == layers and k not in tiny})
            tiny.update(_cut_layer_dicts(defaults, new_layers))
        rope = defaults.get("rope_parameters")
        types = tiny.get("layer_types", defaults.get("layer_types"))
        if rope == {} and types:  # RoPE per layer type with none given (as _family_fixes)
            tiny["rope_parameters"] = {t: {"rope_type": "default", "rope_theta": 10000.0}
                                       for t in set(types)}
        subs[name] = {**defaults, **tiny, **_tiny_mrope(sub, defaults, tiny)}
    return subs


def _cut_layer_dicts(defaults: Dict[str, Any], layers: int) -> Dict[str, Any]:
    """Per-layer settings keyed by layer index (``per_layer_config``) cut to ``layers``."""
    out = {}
    for key, value in defaults.items():
        if isinstance(value, dict) and value and all(
                isinstance(k, int) or (isinstance(k, str) and k.isdigit()) for k in value):
            out[key] = {k: v for k, v in value.items() if int(k) < layers}
    return out


def _tiny_mrope(cls, defaults: Dict[str, Any], tiny: Dict[str, Any]) -> Dict[str, Any]:
    """Multimodal RoPE sections (Qwen2-VL / GLM-4V style, ``[16, 24, 24]`` or ``[8, 12, 12]`` by
    default in the model code, summing to half the rotary size) scaled to the tiny rotary size
    (``qk_rope_head_dim`` where the model has one, else the head size times
    ``partial_rotary_factor``); and the text size a composite's other towers project to
    (``text_hidden_size``, ``out_hidden_size``) set to the tiny hidden size."""
    out: Dict[str, Any] = {k: _TINY_PLAN_SIZES["hidden_size"] for k in
                           ("text_hidden_size", "out_hidden_size") if k in defaults}
    rope = defaults.get("rope_parameters")
    mtype = str(getattr(cls, "model_type", ""))
    if not isinstance(rope, dict) or ("mrope_section" not in rope and not any(
            t in mtype for t in ("vl", "glm4v", "glm_ocr", "omni"))):
        return out
    heads = tiny.get("num_attention_heads", defaults.get("num_attention_heads"))
    hidden = tiny.get("hidden_size", defaults.get("hidden_size"))
    if not (isinstance(heads, int) and isinstance(hidden, int) and heads):
        return out
    rotary = tiny.get("qk_rope_head_dim") or int(
        hidden // heads * float(rope.get("partial_rotary_factor",
                                         defaults.get("partial_rotary_factor", 1.0)) or 1.0))
    half = rotary // 2
    section = list(rope.get("mrope_section") or [16, 24, 24])
    scaled = [max(1, s * half // sum(section)) for s in section]
    scaled[0] += half - sum(scaled)
    out["rope_parameters"] = {**rope, "mrope_section": scaled}
    return out


PLAN_HEADS = {
    "causal": "AutoModelForCausalLM",
    "masked": "AutoModelForMaskedLM",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "image_text": "AutoModelForImageTextToText",
    "seqcls": "AutoModelForSequenceClassification",
}
"""The model classes the auto schedule is swept over: head kind -> transformers' auto class."""


def tiny_plan_model(model_type: str, seed: int = 0, head: str = "causal",
                    **overrides: Any) -> nn.Module:
    """A seeded tiny model of ``model_type`` built from ``tiny_plan_config`` (same seed -> same
    weights), in train mode, with the ``head`` of :data:`PLAN_HEADS` (default: the causal LM,
    ``AutoModelForCausalLM``)."""
    import transformers

    if head not in PLAN_HEADS:
        raise ValueError(f"unknown head {head!r}; one of {', '.join(PLAN_HEADS)}")
    config = tiny_plan_config(model_type, **overrides)
    if head == "seqcls" and getattr(config, "pad_token_id", 0) is None:
        config.pad_token_id = 0  # HF pools the last non-pad token: needs a pad id for batches
    with seeded(seed):
        model = getattr(transformers, PLAN_HEADS[head]).from_config(config)
    return model.train()
