"""Model zoo API: look a benchmark model name up, build its config / model, make inputs.

Everything is built from :mod:`end2end.models.zoo` sizes with random initialisation; nothing is
downloaded (``HF_HUB_OFFLINE=1``). Big models can be built on the meta device to count
parameters for free::

    spec = get_model_spec("bert-xlarge")
    model = build_model("bert-xlarge", device="meta")
    inputs = make_inputs(spec, batch_size=2, seq_len=128)
    loss = build_model("cpu/bert")(**inputs).loss

``scale_down(spec)`` gives a tiny model of the same family and structure for tests.
"""

from __future__ import annotations

import difflib
import os
from typing import Any, Dict, List, Optional, Union

import torch
from torch import nn

from slapo.errors import ConfigError

from end2end.models.shaped import ModelShapeError, shaped_spec
from end2end.models.zoo import FAMILIES, ZOO, ModelSpec

__all__ = [
    "ModelSpec", "UnknownModelError", "ModelShapeError", "list_models", "get_model_spec",
    "build_hf_config",
    "build_model", "make_inputs", "scale_down", "count_parameters", "MODEL_CLASSES",
    "CONFIG_CLASSES",
]

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The HF class each family is trained as (all return ``.loss`` when given ``labels``).
MODEL_CLASSES: Dict[str, str] = {
    "bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM", "albert": "AlbertForMaskedLM",
    "gpt2": "GPT2LMHeadModel", "gpt_neo": "GPTNeoForCausalLM", "opt": "OPTForCausalLM",
    "t5": "T5ForConditionalGeneration", "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM", "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
}
# The HF config class of each family.
CONFIG_CLASSES: Dict[str, str] = {
    "bert": "BertConfig", "roberta": "RobertaConfig", "albert": "AlbertConfig",
    "gpt2": "GPT2Config", "gpt_neo": "GPTNeoConfig", "opt": "OPTConfig", "t5": "T5Config",
    "llama": "LlamaConfig", "qwen3": "Qwen3Config", "mistral": "MistralConfig",
    "gemma3": "Gemma3TextConfig", "phi3": "Phi3Config", "mixtral": "MixtralConfig",
    "qwen3_moe": "Qwen3MoeConfig",
}
# Families built like LLaMA (RMSNorm, rotary, gated FFN, GQA): one spelling of their sizes.
_LLAMA_LIKE = ("llama", "qwen3", "mistral", "gemma3", "phi3", "mixtral", "qwen3_moe")

SpecLike = Union[str, ModelSpec]
assert set(MODEL_CLASSES) | {"wideresnet"} == set(FAMILIES) == set(CONFIG_CLASSES) | {
    "wideresnet"}


class UnknownModelError(ConfigError, LookupError):
    """A model name is not in the zoo."""


def list_models() -> List[str]:
    """All names :func:`get_model_spec` accepts (aliases without an ``org/`` prefix too)."""
    return sorted(ZOO)


def get_model_spec(name: SpecLike) -> ModelSpec:
    """The :class:`ModelSpec` of ``name``: a zoo name (exact, then case-insensitive, then
    without ``org/``), a shape ``FAMILY:key=value,...`` or a path to an HF ``config.json``
    (:mod:`end2end.models.shaped`; :class:`ModelShapeError` when it is wrong)."""
    if isinstance(name, ModelSpec):
        return name
    if name in ZOO:
        return ZOO[name]
    shaped = shaped_spec(name)
    if shaped is not None:
        return shaped
    lowered = {k.lower(): v for k, v in ZOO.items()}
    if name.lower() in lowered:
        return lowered[name.lower()]
    short = {k.split("/")[-1].lower(): v for k, v in ZOO.items() if not k.startswith("cpu/")}
    if name.split("/")[-1].lower() in short:
        return short[name.split("/")[-1].lower()]
    close = difflib.get_close_matches(name, list(ZOO), n=3, cutoff=0.5)
    hint = (f"did you mean {', '.join(close)}?" if close else
            "add it to end2end/models/zoo.py, write a shape FAMILY:key=value,... or the path "
            "of an HF config.json (python -m end2end.models lists the names)")
    raise UnknownModelError(f"unknown model {name!r}", hint=hint)


def _hf_kwargs(spec: ModelSpec) -> Dict[str, Any]:
    """HF config keyword arguments of a transformer spec (family-specific spellings)."""
    f, h = spec.family, spec.hidden
    small_vocab = spec.vocab < 50257  # default special-token ids would be out of range
    if f in ("bert", "roberta", "albert"):
        kw: Dict[str, Any] = dict(vocab_size=spec.vocab, hidden_size=h,
                                  num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                                  intermediate_size=spec.ffn,
                                  max_position_embeddings=spec.max_positions)
        if f == "roberta":  # positions are offset by padding_idx + 1 = 2
            kw.update(max_position_embeddings=spec.max_positions + 2, type_vocab_size=1,
                      layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2)
        if f == "albert":
            kw.update(embedding_size=spec.emb_dim, hidden_act="gelu_new", pad_token_id=0,
                      bos_token_id=2, eos_token_id=3)
        return kw
    if f == "gpt2":
        kw = dict(vocab_size=spec.vocab, n_embd=h, n_layer=spec.layers, n_head=spec.heads,
                  n_inner=spec.ffn, n_positions=spec.max_positions)
    elif f == "gpt_neo":
        if spec.layers % 2:
            raise ConfigError(f"{spec.name}: GPT-Neo alternates global/local attention and "
                              f"needs an even layer count, got {spec.layers}")
        kw = dict(vocab_size=spec.vocab, hidden_size=h, num_layers=spec.layers,
                  num_heads=spec.heads, intermediate_size=spec.ffn,
                  attention_types=[[["global", "local"], spec.layers // 2]], window_size=256,
                  max_position_embeddings=spec.max_positions)
    elif f == "opt":
        kw = dict(vocab_size=spec.vocab, hidden_size=h, num_hidden_layers=spec.layers,
                  num_attention_heads=spec.heads, ffn_dim=spec.ffn,
                  word_embed_proj_dim=spec.emb_dim, max_position_embeddings=spec.max_positions,
                  pad_token_id=1, bos_token_id=2, eos_token_id=2)
        small_vocab = False
    elif f in _LLAMA_LIKE:
        kw = _llama_like_kwargs(spec)
        small_vocab = False
    elif f == "t5":
        kw = dict(vocab_size=spec.vocab, d_model=h, d_kv=spec.dim_per_head, d_ff=spec.ffn,
                  num_layers=spec.layers, num_decoder_layers=spec.decoder_layers or spec.layers,
                  num_heads=spec.heads, feed_forward_proj="gated-gelu" if spec.gated_ffn
                  else "relu", decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        small_vocab = False
    else:
        raise ConfigError(f"{spec.name}: family {f!r} has no HF config",
                          hint=f"families with HF configs: {', '.join(MODEL_CLASSES)}")
    if small_vocab:
        kw.update(bos_token_id=0, eos_token_id=0)
    return kw


def _llama_like_kwargs(spec: ModelSpec) -> Dict[str, Any]:
    """LLaMA's config spelling, shared by today's decoder families (+ their MoE sizes)."""
    kw: Dict[str, Any] = dict(
        vocab_size=spec.vocab, hidden_size=spec.hidden, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads or spec.heads,
        intermediate_size=spec.ffn, max_position_embeddings=spec.max_positions,
        rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        head_dim=spec.dim_per_head)  # Qwen3's/Gemma 3's defaults are not hidden // heads
    if spec.family == "mixtral":
        kw.update(num_local_experts=spec.experts, num_experts_per_tok=spec.experts_per_token)
    elif spec.family == "qwen3_moe":  # every layer sparse; the expert FFN is moe_intermediate
        kw.update(num_experts=spec.experts, num_experts_per_tok=spec.experts_per_token,
                  moe_intermediate_size=spec.ffn, decoder_sparse_step=1, mlp_only_layers=[])
    return kw


def build_hf_config(name: SpecLike, **overrides: Any):
    """The ``transformers`` config of a (transformer) zoo model; ``overrides`` win.

    Example: ``build_hf_config("t5-3b", attn_implementation="eager", dropout_rate=0.0)``.
    """
    import transformers as tf

    spec = get_model_spec(name)
    cls_name = CONFIG_CLASSES.get(spec.family)
    if cls_name is None:
        raise ConfigError(f"{spec.name} is a {spec.family} model, not a transformers model",
                          hint="use build_model() for it")
    kw = _hf_kwargs(spec)
    kw.update(dict(spec.extra))
    kw.update(overrides)
    return getattr(tf, cls_name)(**kw)


def build_model(name: SpecLike, *, device: Union[str, torch.device, None] = None,
                dtype: Optional[torch.dtype] = None, seed: Optional[int] = None,
                **config_overrides: Any) -> nn.Module:
    """A randomly initialised model of ``name`` in train mode.

    Args:
        name: zoo name or a :class:`ModelSpec` (e.g. from :func:`scale_down`).
        device: where to create the parameters; ``"meta"`` allocates nothing (for counting).
        dtype: parameter dtype (default: torch's default dtype).
        seed: if given, ``torch.manual_seed(seed)`` first (same seed -> same weights).
        **config_overrides: passed to :func:`build_hf_config` (transformers models only).
    """
    spec = get_model_spec(name)
    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        if spec.is_vision:
            if config_overrides:
                raise ConfigError(f"{spec.name}: WideResNet takes no config overrides, got "
                                  f"{sorted(config_overrides)}")
            from end2end.models.wideresnet import WideResNetForImageClassification

            model = WideResNetForImageClassification(spec.block_layers, spec.width_per_group,
                                                     spec.num_classes)
        else:
            import transformers as tf

            config = build_hf_config(spec, **config_overrides)
            model = getattr(tf, MODEL_CLASSES[spec.family])(config)
    if dtype is not None:
        model = model.to(dtype)
    return model.train()


def make_inputs(spec: SpecLike, batch_size: int, seq_len: int = 128, dec_seq_len: int = 0, *,
                device: Union[str, torch.device, None] = None,
                dtype: Optional[torch.dtype] = None,
                generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
    """Synthetic keyword inputs with ``labels`` for one training step of ``spec``.

    Token models: random ids in ``[3, vocab)`` (labels = ids; T5 labels have ``dec_seq_len``
    tokens). WideResNet: ``pixel_values`` of ``image_size`` squared (``seq_len`` is ignored, the
    artifact passes 1) and class labels. ``dtype`` only applies to ``pixel_values``.
    """
    spec = get_model_spec(spec)
    g = generator or torch.Generator().manual_seed(0)
    if spec.is_vision:
        size = (batch_size, 3, spec.image_size, spec.image_size)
        pixels = torch.rand(size, generator=g).to(device=device, dtype=dtype or torch.float32)
        labels = torch.randint(0, spec.num_classes, (batch_size,), generator=g)
        return {"pixel_values": pixels, "labels": labels.to(device)}
    if seq_len > spec.max_positions:
        raise ConfigError(f"{spec.name}: sequence length {seq_len} exceeds its "
                          f"{spec.max_positions} positions")
    ids = torch.randint(3, spec.vocab, (batch_size, seq_len), generator=g)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if spec.is_encoder_decoder:
        if dec_seq_len < 1:
            raise ConfigError(f"{spec.name} is an encoder-decoder model: DEC_SEQ_LEN must be >= 1")
        inputs["labels"] = torch.randint(3, spec.vocab, (batch_size, dec_seq_len), generator=g)
    else:
        inputs["labels"] = ids.clone()
    return {k: v.to(device) for k, v in inputs.items()}


def scale_down(spec: SpecLike, layers: int = 2, hidden: int = 32, heads: int = 4) -> ModelSpec:
    """A tiny model of the same family and structure (GQA, factorised embedding, gating, ...).

    For tests: builds in milliseconds. The name becomes ``tiny/<name>``.
    """
    spec = get_model_spec(spec)
    name = "tiny/" + spec.name
    if spec.is_vision:
        return spec.replace(name=name, block_layers=(1, 1, 1, 1), width_per_group=4,
                            image_size=32, num_classes=10)
    head_dim = hidden // heads
    return spec.replace(
        name=name, layers=layers, decoder_layers=layers if spec.decoder_layers else 0,
        hidden=hidden, heads=heads, head_dim=head_dim if spec.head_dim else 0,
        kv_heads=heads // 2 if spec.kv_heads and spec.kv_heads < spec.heads else
        (heads if spec.kv_heads else 0),
        ffn=2 * hidden if spec.ffn < 3 * spec.hidden else 4 * hidden,
        vocab=128, max_positions=64,
        embedding_size=hidden // 2 if spec.embedding_size else 0,
        experts=min(spec.experts, 4), experts_per_token=min(spec.experts_per_token, 2))


def count_parameters(model: nn.Module, unique: bool = True) -> int:
    """Number of parameters (tied/shared tensors counted once when ``unique``)."""
    params = model.parameters() if unique else (p for _, p in
                                                model.named_parameters(remove_duplicate=False))
    return sum(p.numel() for p in params)
