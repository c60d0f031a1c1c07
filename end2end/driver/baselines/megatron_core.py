"""The ``megatron`` baseline: megatron-core's own GPT, BERT and T5 models (and LLaMA, trained as
Megatron-LM trains it: a GPT with RMSNorm, SwiGLU and RoPE), built from the same hyperparameters
as the HuggingFace models the other modes train.

``build_megatron_model(hf_config)`` returns the megatron-core model at tensor-parallel size =
megatron's parallel state (initialised here, TP = world size, unless done before) with the *local*
layer specs (plain PyTorch modules; no TransformerEngine, no Apex). ``megatron_loss_fn(hf_config)``
returns a ``loss_fn(model, batch)`` that takes the same HuggingFace-style batch as every other mode
(``input_ids``, ``attention_mask``, ``labels``; T5 ``labels`` are the decoder targets) and returns
the mean token loss, so ``slapo.dialects.megatron.MegatronRuntime`` drives the baseline exactly
like a Slapo model.

Mapping notes: GPT-2 and GPT-Neo become a GPT (learned absolute positions, tied embeddings,
tanh-GELU; GPT-Neo's local attention layers become global ones); BERT/RoBERTa a BERT without the
binary (NSP) head; LLaMA (and the LLaMA-shaped Mistral and Qwen2) a GPT with RMSNorm,
SwiGLU (``gated_linear_unit`` + SiLU: fc1 holds gate then up), rotary positions (base = the HF
``rope_theta``), no linear biases (Qwen2: q/k/v biases), untied output weights unless the config
ties them and grouped-query attention (``num_query_groups`` = ``num_key_value_heads``);
:func:`load_hf_llama_weights` copies a HuggingFace LLaMA's weights into it (the proof that both
compute the same loss and gradients: ``tests/end2end/driver/test_megatron_llama.py``). Mistral's
sliding window and scaled RoPE are refused (no local-spec support). T5 becomes a T5 with RMSNorm
and no linear biases, but learned absolute positions
(megatron-core's local attention cannot add T5's relative position bias: "Attention bias is not
supported for DotProductAttention"; that needs TransformerEngine). On CPU
the weights are initialised on the CPU (``use_cpu_initialization``) from the full master weight, so
a given seed gives the same model at every tensor-parallel size.

Attention's scale, mask and softmax are fused into one kernel as Megatron-LM's training script
does by default (``--no-masked-softmax-fusion`` turns it off; megatron-core's
``TransformerConfig`` defaults to off) wherever that kernel exists: it is a CUDA extension built
with Megatron-LM or Apex (:data:`FUSED_SOFTMAX_MODULES`; :func:`fused_softmax_available`).
Elsewhere (a CPU, a GPU without the extension) megatron-core's PyTorch softmax runs.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from slapo.dialects.megatron import initialize_megatron
from slapo.runtime.distributed import pick_device
from slapo.errors import ConfigError

__all__ = ["build_megatron_model", "megatron_loss_fn", "transformer_config", "family_of",
           "hf_llama_to_megatron", "load_hf_llama_weights", "FUSED_SOFTMAX_MODULES",
           "fused_softmax_available"]

Batch = Dict[str, torch.Tensor]
_GPT, _BERT, _T5 = ("gpt2", "gpt_neo"), ("bert", "roberta"), ("t5",)
_LLAMA = ("llama", "mistral", "qwen2")  # LLaMA-shaped decoders (Megatron-LM's GPT + SwiGLU/RoPE)
_FAMILIES = (("gpt", _GPT), ("bert", _BERT), ("t5", _T5), ("llama", _LLAMA))


def family_of(hf_config: Any) -> str:
    """``"gpt"``, ``"bert"``, ``"t5"`` or ``"llama"`` for a HuggingFace config, else
    :class:`ConfigError`."""
    model_type = getattr(hf_config, "model_type", None)
    for family, types in _FAMILIES:
        if model_type in types:
            return family
    raise ConfigError(f"no megatron-core baseline for model type {model_type!r}",
                      call="build_megatron_model",
                      hint=f"use a config of type {', '.join(_GPT + _BERT + _T5 + _LLAMA)}")


#: the CUDA extensions of megatron-core's fused softmax (``megatron/core/fusions/fused_softmax.py``)
FUSED_SOFTMAX_MODULES = ("scaled_upper_triang_masked_softmax_cuda", "scaled_masked_softmax_cuda",
                         "scaled_softmax_cuda")


def fused_softmax_available() -> bool:
    """Whether megatron-core's fused softmax kernels can be imported (module docstring)."""
    import importlib.util
    import sys

    return all(name in sys.modules or importlib.util.find_spec(name) is not None
               for name in FUSED_SOFTMAX_MODULES)


def _rope_theta(c: Any) -> float:
    """The RoPE base of a LLaMA-shaped config; refuses scaled RoPE (llama3, yarn, ...)."""
    # transformers 5: rope_parameters (rope_scaling is its alias); 4.x: rope_scaling + rope_theta
    rope = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ConfigError(f"{c.model_type} config: RoPE type {kind!r} is not supported by the "
                          f"megatron-core baseline (plain RoPE only)", call="transformer_config",
                          hint="use rope_parameters={'rope_type': 'default', 'rope_theta': ...}")
    return float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0)))


def _check_llama(c: Any) -> None:
    """Refuse what megatron-core's local GPT cannot express for a LLaMA-shaped config."""
    def refuse(what: str, hint: str) -> None:
        raise ConfigError(f"{c.model_type} config: {what}", call="transformer_config", hint=hint)

    if getattr(c, "hidden_act", "silu") != "silu":
        refuse(f"hidden_act={c.hidden_act!r} (SwiGLU needs 'silu')", "set hidden_act='silu'")
    if getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False):
        refuse("attention_bias/mlp_bias=True (LLaMA's linears have no biases)",
               "set attention_bias=False and mlp_bias=False")
    window = getattr(c, "sliding_window", None)
    if c.model_type == "qwen2" and not getattr(c, "use_sliding_window", False):
        window = None
    if window is not None and window < c.max_position_embeddings:
        refuse(f"sliding_window={window} < max_position_embeddings={c.max_position_embeddings} "
               "(no sliding-window attention in megatron-core's local layer spec)",
               "set sliding_window=None (or >= max_position_embeddings)")
    _rope_theta(c)


def _llama_kwargs(c: Any) -> Dict[str, Any]:
    """TransformerConfig fields of Megatron-LM's LLaMA recipe for a LLaMA-shaped HF config."""
    _check_llama(c)
    heads = c.num_attention_heads
    return dict(
        num_layers=c.num_hidden_layers, hidden_size=c.hidden_size, num_attention_heads=heads,
        num_query_groups=getattr(c, "num_key_value_heads", None) or heads,
        kv_channels=getattr(c, "head_dim", None) or c.hidden_size // heads,
        ffn_hidden_size=c.intermediate_size, hidden_dropout=0.0,
        attention_dropout=getattr(c, "attention_dropout", 0.0), layernorm_epsilon=c.rms_norm_eps,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=c.model_type == "qwen2")


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return functools.partial(F.gelu, approximate="tanh")
    return {"gelu": F.gelu, "relu": F.relu, "silu": F.silu}.get(name, F.gelu)


def transformer_config(hf_config: Any, recompute: Optional[str] = None, **overrides: Any):
    """A megatron-core ``TransformerConfig`` with ``hf_config``'s sizes, at megatron's current
    tensor-parallel size. ``recompute``: ``None``, ``"full"`` or ``"selective"`` (megatron's
    activation recomputation)."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_config import TransformerConfig

    c = hf_config
    family = family_of(c)
    if family == "gpt":
        hidden = getattr(c, "n_embd", None) or c.hidden_size
        kw = dict(
            num_layers=getattr(c, "n_layer", None) or c.num_layers,
            hidden_size=hidden,
            num_attention_heads=getattr(c, "n_head", None) or c.num_heads,
            ffn_hidden_size=(getattr(c, "n_inner", None) or getattr(c, "intermediate_size", None)
                             or 4 * hidden),
            hidden_dropout=getattr(c, "resid_pdrop", getattr(c, "resid_dropout", 0.0)),
            attention_dropout=getattr(c, "attn_pdrop", getattr(c, "attention_dropout", 0.0)),
            layernorm_epsilon=c.layer_norm_epsilon,
            activation_func=_activation(getattr(c, "activation_function", "gelu_new")))
    elif family == "bert":
        kw = dict(
            num_layers=c.num_hidden_layers, hidden_size=c.hidden_size,
            num_attention_heads=c.num_attention_heads, ffn_hidden_size=c.intermediate_size,
            hidden_dropout=c.hidden_dropout_prob, attention_dropout=c.attention_probs_dropout_prob,
            layernorm_epsilon=c.layer_norm_eps, activation_func=_activation(c.hidden_act))
    elif family == "llama":
        kw = _llama_kwargs(c)
    else:
        gated = "gated" in getattr(c, "feed_forward_proj", "relu")
        kw = dict(
            num_layers=c.num_layers, hidden_size=c.d_model, num_attention_heads=c.num_heads,
            kv_channels=c.d_kv, ffn_hidden_size=c.d_ff, hidden_dropout=c.dropout_rate,
            attention_dropout=c.dropout_rate, layernorm_epsilon=c.layer_norm_epsilon,
            add_bias_linear=False, normalization="RMSNorm", gated_linear_unit=gated,
            activation_func=_activation(getattr(c, "dense_act_fn", "relu")))
    if recompute == "full":
        kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif recompute == "selective":
        kw.update(recompute_granularity="selective")
    elif recompute not in (None, "", "0"):
        raise ConfigError(f"unknown recompute mode {recompute!r}", call="transformer_config",
                          hint="use None, 'full' or 'selective'")
    kw.update(
        tensor_model_parallel_size=ps.get_tensor_model_parallel_world_size(),
        use_cpu_initialization=pick_device().type == "cpu", params_dtype=torch.float32,
        init_method_std=getattr(c, "initializer_range", 0.02),
        masked_softmax_fusion=fused_softmax_available())
    kw.update(overrides)
    return TransformerConfig(**kw)


def build_megatron_model(hf_config: Any, tensor_model_parallel_size: Optional[int] = None, *,
                         recompute: Optional[str] = None, seed: int = 1234,
                         dtype: Optional[torch.dtype] = None) -> nn.Module:
    """megatron-core's GPTModel / BertModel / T5Model with ``hf_config``'s hyperparameters, on
    this rank's device. Initialises megatron (:func:`initialize_megatron`, TP =
    ``tensor_model_parallel_size`` or the world size) if needed; the weights are drawn after
    ``torch.manual_seed(seed)``. ``dtype`` (fp16/bf16): the precision the model will train in,
    as Megatron-LM's ``--fp16``/``--bf16`` tell its config (attention's softmax then runs in
    fp32, fused or not); the caller casts the model."""
    initialize_megatron(tensor_model_parallel_size)
    config = transformer_config(hf_config, recompute=recompute,
                                fp16=dtype == torch.float16, bf16=dtype == torch.bfloat16)
    family = family_of(hf_config)
    torch.manual_seed(seed)
    if family == "gpt":
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        max_len = getattr(hf_config, "n_positions", None) or hf_config.max_position_embeddings
        model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=hf_config.vocab_size,
                         max_sequence_length=max_len,
                         share_embeddings_and_output_weights=hf_config.tie_word_embeddings)
    elif family == "llama":
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        model = GPTModel(config, get_gpt_layer_local_spec(normalization="RMSNorm"),
                         vocab_size=hf_config.vocab_size,
                         max_sequence_length=hf_config.max_position_embeddings,
                         share_embeddings_and_output_weights=hf_config.tie_word_embeddings,
                         position_embedding_type="rope", rotary_base=_rope_theta(hf_config))
    elif family == "bert":
        from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
        from megatron.core.models.bert.bert_model import BertModel

        model = BertModel(config, num_tokentypes=hf_config.type_vocab_size,
                          transformer_layer_spec=bert_layer_local_spec,
                          vocab_size=hf_config.vocab_size,
                          max_sequence_length=hf_config.max_position_embeddings,
                          share_embeddings_and_output_weights=True, add_binary_head=False)
    else:
        from megatron.core.models.T5 import T5Model
        from megatron.core.models.T5.t5_spec import (
            get_t5_decoder_with_local_block_spec,
            get_t5_encoder_with_local_block_spec,
        )

        layers = hf_config.num_decoder_layers or hf_config.num_layers
        model = T5Model(config, config,
                        get_t5_encoder_with_local_block_spec(hf_config.num_layers),
                        get_t5_decoder_with_local_block_spec(layers),
                        vocab_size=hf_config.vocab_size,
                        max_sequence_length=getattr(hf_config, "n_positions", 512),
                        share_embeddings_and_output_weights=hf_config.tie_word_embeddings,
                        position_embedding_type="learned_absolute")
    return model.to(pick_device())


def _masked_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(per_token.dtype)
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def _key_padding(attention_mask: torch.Tensor, queries: int) -> torch.Tensor:
    """[b, 1, q, k] bool, True where the key is padding (megatron masks True positions)."""
    pad = attention_mask == 0
    return pad[:, None, None, :].expand(-1, 1, queries, -1)


def _causal(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).triu(1)[None, None]


def _gpt_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    ids = batch["input_ids"]
    b, s = ids.shape
    labels = batch.get("labels", ids)
    # HF shifts inside the model; megatron takes the next-token targets per position.
    targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
    mask = _causal(s, ids.device)
    if "attention_mask" in batch:
        mask = mask | _key_padding(batch["attention_mask"], s)
    position_ids = torch.arange(s, device=ids.device).expand(b, s)
    per_token = model(ids, position_ids, mask, labels=targets.clamp(min=0))
    return _masked_mean(per_token, targets != -100)


def _bert_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    ids = batch["input_ids"]
    labels = batch.get("labels", ids)
    attention = batch.get("attention_mask", torch.ones_like(ids))
    types = batch.get("token_type_ids")
    if types is None:
        types = torch.zeros_like(ids)
    per_token, _ = model(ids, attention, tokentype_ids=types, lm_labels=labels.clamp(min=0))
    return _masked_mean(per_token, labels != -100)


def _t5_loss(model: nn.Module, batch: Batch, start_id: int = 0) -> torch.Tensor:
    ids, labels = batch["input_ids"], batch["labels"]
    dec = batch.get("decoder_input_ids")
    if dec is None:  # HF's shift-right of the labels
        dec = torch.cat([torch.full_like(labels[:, :1], start_id), labels[:, :-1]], dim=1)
        dec = dec.masked_fill(dec == -100, 0)
    s, t = ids.shape[1], dec.shape[1]
    attention = batch.get("attention_mask", torch.ones_like(ids))
    per_token = model(ids, dec, _key_padding(attention, s), _causal(t, ids.device),
                      _key_padding(attention, t), lm_labels=labels.clamp(min=0))
    return _masked_mean(per_token, labels != -100)


def megatron_loss_fn(hf_config: Any) -> Callable[[nn.Module, Batch], torch.Tensor]:
    """The ``loss_fn(model, batch)`` for :func:`build_megatron_model`'s model (mean token loss of
    a HuggingFace-style batch, positions with label -100 excluded)."""
    family = family_of(hf_config)
    if family in ("gpt", "llama"):  # causal LM: next-token targets
        return _gpt_loss
    if family == "bert":
        return _bert_loss
    return functools.partial(_t5_loss, start_id=hf_config.decoder_start_token_id or 0)


# ---- HuggingFace LLaMA weights in megatron-core's layout --------------------------------------

def _grouped_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 groups: int) -> torch.Tensor:
    """HF's separate q [heads*d, ...], k and v [groups*d, ...] as megatron-core's fused rows:
    per query group its query heads, then its key head, then its value head."""
    parts = [t.reshape(groups, -1, *t.shape[1:]) for t in (q, k, v)]
    return torch.cat(parts, dim=1).reshape(-1, *q.shape[1:])


def hf_llama_to_megatron(hf_state: Dict[str, torch.Tensor], hf_config: Any, tp_rank: int = 0,
                         tp_size: int = 1) -> Dict[str, torch.Tensor]:
    """This tensor-parallel rank's megatron-core GPT parameters (names of
    :func:`build_megatron_model`'s LLaMA) from a HuggingFace ``LlamaForCausalLM`` (or Mistral,
    Qwen2) state: ``hf_state`` maps HF parameter names to full tensors, weights or their gradients
    alike (so HF gradients can be compared with megatron's in megatron's layout).

    Layout: ``linear_qkv`` rows grouped per query group (``[q heads, k, v]`` of group 0, then
    group 1, ...), split in ``tp_size`` contiguous blocks as megatron splits them (also when there
    are fewer groups than ranks); ``linear_fc1`` = this rank's block of ``gate_proj`` rows then
    its block of ``up_proj`` rows (megatron's SwiGLU applies SiLU to the first half); row-parallel
    ``linear_proj``/``linear_fc2`` split by columns; embedding and output layer by vocabulary rows;
    norms whole.
    """
    family_of(hf_config)

    def shard(t: torch.Tensor, dim: int) -> torch.Tensor:
        if t.shape[dim] % tp_size:
            raise ConfigError(f"dimension {dim} of a {tuple(t.shape)} tensor does not split over "
                              f"{tp_size} tensor-parallel ranks", call="hf_llama_to_megatron",
                              hint="use a tensor-parallel size that divides heads, FFN and vocab")
        return t.chunk(tp_size, dim)[tp_rank].contiguous()

    groups = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    out = {"embedding.word_embeddings.weight": shard(hf_state["model.embed_tokens.weight"], 0),
           "decoder.final_layernorm.weight": hf_state["model.norm.weight"]}
    if not hf_config.tie_word_embeddings:
        out["output_layer.weight"] = shard(hf_state["lm_head.weight"], 0)
    for i in range(hf_config.num_hidden_layers):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn = hf + "self_attn."
        for kind in ("weight", "bias"):
            if attn + f"q_proj.{kind}" in hf_state:
                qkv = [hf_state[attn + f"{n}_proj.{kind}"] for n in "qkv"]
                out[mg + f"self_attention.linear_qkv.{kind}"] = shard(
                    _grouped_qkv(*qkv, groups), 0)
        gate, up = (hf_state[hf + f"mlp.{n}_proj.weight"] for n in ("gate", "up"))
        out.update({
            mg + "input_layernorm.weight": hf_state[hf + "input_layernorm.weight"],
            mg + "self_attention.linear_proj.weight": shard(hf_state[attn + "o_proj.weight"], 1),
            mg + "pre_mlp_layernorm.weight": hf_state[hf + "post_attention_layernorm.weight"],
            mg + "mlp.linear_fc1.weight": torch.cat([shard(gate, 0), shard(up, 0)]),
            mg + "mlp.linear_fc2.weight": shard(hf_state[hf + "mlp.down_proj.weight"], 1)})
    return out


def load_hf_llama_weights(model: nn.Module, hf_model: nn.Module) -> None:
    """Copy a HuggingFace LLaMA-shaped model's weights into :func:`build_megatron_model`'s
    model of the same config, at megatron's current tensor-parallel rank and size.

    Raises:
        ConfigError: the two models' parameters do not correspond (names or shapes), e.g. the
            configs differ.
    """
    from megatron.core import parallel_state as ps

    mapped = hf_llama_to_megatron(dict(hf_model.state_dict()), hf_model.config,
                                  ps.get_tensor_model_parallel_rank(),
                                  ps.get_tensor_model_parallel_world_size())
    params = dict(model.named_parameters())
    if set(params) != set(mapped):
        odd = sorted(set(params) ^ set(mapped))[:4]
        raise ConfigError(f"megatron model and HF weights do not correspond: {odd} on one side "
                          "only", call="load_hf_llama_weights",
                          hint="build the megatron model from the HF model's own config")
    with torch.no_grad():
        for name, p in params.items():
            if p.shape != mapped[name].shape:
                raise ConfigError(f"{name}: megatron shape {tuple(p.shape)}, HF gives "
                                  f"{tuple(mapped[name].shape)}", call="load_hf_llama_weights",
                                  hint="build the megatron model from the HF model's own config")
            p.copy_(mapped[name])
