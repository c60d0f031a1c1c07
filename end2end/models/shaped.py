"""Models by shape: a config line's MODEL as ``FAMILY:key=value,...`` or an HF ``config.json``.

Published runs use shapes the zoo lacks, and users want their own models in a sweep, so besides
a zoo name (:data:`end2end.models.zoo.ZOO`) a MODEL can be

* ``FAMILY:key=value,...``: a zoo family (or a zoo name) with the zoo's own field names
  (:class:`~end2end.models.zoo.ModelSpec`) as overrides, e.g.
  ``gpt2:layers=24,hidden=1920,heads=15,ffn=7680,vocab=51200`` or
  ``llama:layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256``. The family's
  base model (:data:`BASES`) gives every field not written; when ``hidden`` changes and ``ffn``
  is not given, the FFN keeps the base's ratio to ``hidden`` (GPT-2: 4h), and when ``heads``
  changes a base without grouped-query attention keeps ``kv_heads`` = ``heads``. The keys a
  family takes are :func:`valid_keys` (only what its HF config is built from); WideResNet takes
  ``block_layers=3/4/6/3``, ``width_per_group``, ``image_size``, ``num_classes``.
* a path to an HF ``config.json`` (or a directory holding one), read without downloading: its
  ``model_type`` picks the family, its sizes the fields, and a few settings that change the
  computation (rotary base and scaling, tied embeddings, activation, norms' epsilon, sliding
  window, biases, dropout probabilities) are passed on to the HF config; the rest (ids, dtype,
  architectures) is not.

The text itself is the model's name everywhere (results rows, resume keys), so the driver, the
simulator and the FLOP count (:mod:`end2end.models.flops`) all see the same shape. Vocabularies
are padded like the zoo's (:func:`~end2end.models.zoo.padded_vocab`). Mistakes are one line
naming the key and the valid ones (:class:`ModelShapeError`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from slapo.errors import ConfigError

from end2end.models.zoo import FAMILIES, ZOO, ModelSpec, padded_vocab

__all__ = ["BASES", "ModelShapeError", "is_shaped", "shaped_spec", "valid_keys",
           "spec_from_hf_config", "HF_MODEL_TYPES"]

#: The zoo model whose fields a ``FAMILY:...`` shape starts from.
BASES: Dict[str, str] = {
    "bert": "bert-base-uncased", "roberta": "roberta-base", "albert": "albert-base-v2",
    "gpt2": "gpt2", "gpt_neo": "EleutherAI/gpt-neo-125M", "opt": "facebook/opt-125m",
    "t5": "t5-base", "llama": "llama-7b", "qwen3": "Qwen/Qwen3-8B",
    "mistral": "mistralai/Mistral-7B-v0.3", "gemma3": "google/gemma-3-4b-pt",
    "phi3": "microsoft/Phi-3-mini-4k-instruct", "mixtral": "mistralai/Mixtral-8x7B-v0.1",
    "qwen3_moe": "Qwen/Qwen3-30B-A3B", "wideresnet": "wideresnet-250M",
}
assert set(BASES) == set(FAMILIES)

_COMMON = ("layers", "hidden", "heads", "ffn", "vocab", "max_positions")
_LLAMA_LIKE = ("llama", "qwen3", "mistral", "gemma3", "phi3", "mixtral", "qwen3_moe")
_KEYS: Dict[str, Tuple[str, ...]] = {
    "albert": _COMMON + ("embedding_size",), "opt": _COMMON + ("embedding_size",),
    "t5": _COMMON + ("decoder_layers", "head_dim", "gated_ffn"),
    "wideresnet": ("block_layers", "width_per_group", "image_size", "num_classes"),
    **{f: _COMMON + ("kv_heads", "head_dim") for f in _LLAMA_LIKE},
}
for _moe in ("mixtral", "qwen3_moe"):
    _KEYS[_moe] += ("experts", "experts_per_token")

#: HF ``model_type`` -> zoo family (what a ``config.json`` may be).
HF_MODEL_TYPES: Dict[str, str] = {
    "bert": "bert", "roberta": "roberta", "albert": "albert", "gpt2": "gpt2",
    "gpt_neo": "gpt_neo", "opt": "opt", "t5": "t5", "llama": "llama", "qwen3": "qwen3",
    "mistral": "mistral", "gemma3_text": "gemma3", "gemma3": "gemma3", "phi3": "phi3",
    "mixtral": "mixtral", "qwen3_moe": "qwen3_moe",
}
# HF config settings kept from a config.json (they change what the model computes).
_HF_EXTRAS = ("rope_theta", "rope_scaling", "rope_parameters", "tie_word_embeddings",
              "hidden_act", "activation_function", "rms_norm_eps", "layer_norm_eps",
              "layer_norm_epsilon", "sliding_window", "use_sliding_window", "attention_bias",
              "mlp_bias", "do_layer_norm_before", "attention_types", "window_size",
              "query_pre_attn_scalar", "partial_rotary_factor", "qkv_bias",
              # dropout probabilities: a mask per dropout is kept for backward (memory, time)
              "resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout_prob",
              "attention_probs_dropout_prob", "resid_dropout", "embed_dropout",
              "attention_dropout", "dropout", "activation_dropout", "dropout_rate",
              # the attention's implementation (HF's ``eager``: scores, softmax and dropout as
              # separate kernels, as a published run's own model computed them)
              "attn_implementation")


class ModelShapeError(ConfigError):
    """A ``FAMILY:key=value`` shape or an HF ``config.json`` cannot be a benchmark model."""


def valid_keys(family: str) -> Tuple[str, ...]:
    """The override keys ``family`` takes (``ModelSpec`` field names)."""
    return _KEYS.get(family, _COMMON)


def is_shaped(name: str) -> bool:
    """Whether ``name`` is a shape (``prefix:...``) or a path to an HF config, not a zoo name."""
    if name in ZOO:
        return False
    return ":" in name or name.endswith(".json") or (Path(name) / "config.json").is_file()


def _family(prefix: str) -> Tuple[str, ModelSpec]:
    """The family and base spec of a shape's prefix: a family (``gpt-neo`` = ``gpt_neo``) or a
    zoo name."""
    if prefix in ZOO:
        return ZOO[prefix].family, ZOO[prefix]
    family = prefix.lower().replace("-", "_")
    if family in BASES:
        return family, ZOO[BASES[family]]
    raise ModelShapeError(f"model '{prefix}:...': unknown family {prefix!r}",
                          hint=f"write one of {', '.join(FAMILIES)} (or a zoo name) before ':'")


def _value(text: str, key: str, value: str) -> Any:
    """One override value: a positive integer, a bool (``gated_ffn``) or ``a/b/c/d``."""
    if key == "gated_ffn":
        if value.lower() in ("1", "true", "yes"):
            return True
        if value.lower() in ("0", "false", "no"):
            return False
        raise ModelShapeError(f"model {text!r}: gated_ffn={value!r} is not a boolean",
                              hint="write gated_ffn=true or gated_ffn=false")
    parts = value.split("/") if key == "block_layers" else [value]
    try:
        numbers = tuple(int(p) for p in parts)
    except ValueError:
        numbers = ()
    if not numbers or min(numbers) < 1 or (key == "block_layers" and len(numbers) != 4):
        want = "four positive integers a/b/c/d" if key == "block_layers" else "a positive integer"
        raise ModelShapeError(f"model {text!r}: {key}={value!r} is not {want}",
                              hint=f"e.g. {key}=" + ("3/4/6/3" if key == "block_layers" else "24"))
    return numbers if key == "block_layers" else numbers[0]


def _check(spec: ModelSpec, text: str) -> None:
    """Shape rules the HF model would break on later (said now, with the key to change)."""
    def bad(what: str, hint: str) -> ModelShapeError:
        return ModelShapeError(f"model {text!r}: {what}", hint=hint)

    if spec.is_vision:
        return
    if spec.heads and not spec.head_dim and spec.hidden % spec.heads:
        raise bad(f"hidden {spec.hidden} is not divisible by heads {spec.heads}",
                  "choose heads that divide hidden" + (" or give head_dim" if "head_dim" in
                                                       valid_keys(spec.family) else ""))
    if spec.kv_heads and spec.heads % spec.kv_heads:
        raise bad(f"heads {spec.heads} is not a multiple of kv_heads {spec.kv_heads}",
                  "kv_heads must divide heads")
    if spec.family == "gpt_neo" and spec.layers % 2:
        raise bad(f"layers {spec.layers} is odd", "GPT-Neo alternates global and local "
                  "attention: give an even layer count")
    if spec.experts_per_token > spec.experts:
        raise bad(f"experts_per_token {spec.experts_per_token} exceeds experts {spec.experts}",
                  "route each token to at most the number of experts")


def _finish(spec: ModelSpec, text: str, note: str) -> ModelSpec:
    """The padded vocabulary (as the zoo pads), the note, the checks."""
    if spec.vocab and padded_vocab(spec.vocab) != spec.vocab:
        note += f"; vocab {spec.vocab} padded to {padded_vocab(spec.vocab)}"
        spec = spec.replace(vocab=padded_vocab(spec.vocab))
    spec = spec.replace(note=note)
    _check(spec, text)
    return spec


def _label(spec: ModelSpec) -> str:
    if spec.is_vision:
        return f"{spec.family} w{spec.width_per_group}"
    return f"{spec.family} L{spec.layers} h{spec.hidden}"


@functools.lru_cache(maxsize=256)
def _from_overrides(text: str) -> ModelSpec:
    prefix, _, body = text.partition(":")
    family, base = _family(prefix.strip())
    keys = valid_keys(family)
    changes: Dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in body.split(","))):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or key not in keys:
            what = (f"'{item}' is not key=value" if not sep else
                    f"unknown key {key!r} for family {family}")
            raise ModelShapeError(f"model {text!r}: {what}", hint=f"valid keys: {', '.join(keys)}")
        if key in changes:
            raise ModelShapeError(f"model {text!r}: key {key!r} given twice",
                                  hint="write each key once")
        changes[key] = _value(text, key, value)
    if "hidden" in changes and "ffn" not in changes and base.hidden:
        changes["ffn"] = round(base.ffn * changes["hidden"] / base.hidden)
    if "heads" in changes and "kv_heads" not in changes and base.kv_heads == base.heads:
        changes["kv_heads"] = changes["heads"] if base.kv_heads else 0
    if "layers" in changes and base.decoder_layers and "decoder_layers" not in changes:
        changes["decoder_layers"] = changes["layers"]
    spec = base.replace(name=text, **changes)
    spec = spec.replace(label=_label(spec))
    return _finish(spec, text, f"shape: {base.name} with {body or 'no changes'}")


def _need(data: Dict[str, Any], key: str, path: str) -> Any:
    if data.get(key) is None:
        raise ModelShapeError(f"HF config {path}: no {key!r}",
                              hint="give a complete config.json (as saved by transformers)")
    return data[key]


def spec_from_hf_config(data: Dict[str, Any], name: str, path: str = "") -> ModelSpec:
    """The :class:`ModelSpec` of an HF config's dict (``config.json``), named ``name``."""
    path = path or name
    model_type = data.get("model_type", "")
    if model_type == "gemma3" and isinstance(data.get("text_config"), dict):
        data = {**data["text_config"], "model_type": "gemma3_text"}
    family = HF_MODEL_TYPES.get(model_type)
    if family is None:
        raise ModelShapeError(f"HF config {path}: model_type {model_type!r} is not supported",
                              hint=f"model types: {', '.join(sorted(HF_MODEL_TYPES))}")
    get = functools.partial(_need, data, path=path)
    fields: Dict[str, Any] = dict(vocab=get("vocab_size"))
    if family in ("bert", "roberta", "albert"):
        fields.update(layers=get("num_hidden_layers"), hidden=get("hidden_size"),
                      heads=get("num_attention_heads"), ffn=get("intermediate_size"),
                      max_positions=get("max_position_embeddings") - (2 if family == "roberta"
                                                                      else 0))
        if family == "albert":
            fields["embedding_size"] = get("embedding_size")
    elif family == "gpt2":
        fields.update(layers=get("n_layer"), hidden=get("n_embd"), heads=get("n_head"),
                      ffn=data.get("n_inner") or 4 * get("n_embd"),
                      max_positions=get("n_positions"))
    elif family == "gpt_neo":
        fields.update(layers=get("num_layers"), hidden=get("hidden_size"),
                      heads=get("num_heads"),
                      ffn=data.get("intermediate_size") or 4 * get("hidden_size"),
                      max_positions=get("max_position_embeddings"))
    elif family == "opt":
        fields.update(layers=get("num_hidden_layers"), hidden=get("hidden_size"),
                      heads=get("num_attention_heads"), ffn=get("ffn_dim"),
                      max_positions=get("max_position_embeddings"),
                      embedding_size=data.get("word_embed_proj_dim") or 0)
    elif family == "t5":
        fields.update(layers=get("num_layers"), hidden=get("d_model"), heads=get("num_heads"),
                      head_dim=get("d_kv"), ffn=get("d_ff"), max_positions=4096,
                      decoder_layers=data.get("num_decoder_layers") or get("num_layers"),
                      gated_ffn=str(data.get("feed_forward_proj", "")).startswith("gated"))
    else:  # LLaMA-like
        heads = get("num_attention_heads")
        fields.update(layers=get("num_hidden_layers"), hidden=get("hidden_size"), heads=heads,
                      kv_heads=data.get("num_key_value_heads") or heads,
                      head_dim=data.get("head_dim") or 0, gated_ffn=True,
                      schedule="" if family == "llama" else "auto",
                      max_positions=get("max_position_embeddings"),
                      ffn=get("moe_intermediate_size" if family == "qwen3_moe"
                              else "intermediate_size"))
        if family == "mixtral":
            fields.update(experts=get("num_local_experts"),
                          experts_per_token=get("num_experts_per_tok"))
        elif family == "qwen3_moe":
            fields.update(experts=get("num_experts"), experts_per_token=get("num_experts_per_tok"))
    extra = tuple((k, data[k]) for k in _HF_EXTRAS if data.get(k) is not None)
    spec = ModelSpec(name=name, family=family, label="", extra=extra, **fields)
    spec = spec.replace(label=_label(spec))
    return _finish(spec, name, f"HF config {path} ({model_type})")


def _from_path(text: str) -> ModelSpec:
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelShapeError(f"HF config {text}: {exc.strerror or exc}",
                              hint="give the path of a config.json (relative to the directory "
                                   "the command runs in) or a zoo name") from None
    except ValueError as exc:
        raise ModelShapeError(f"HF config {text}: not JSON ({exc})",
                              hint="give a config.json as saved by transformers") from None
    if not isinstance(data, dict):
        raise ModelShapeError(f"HF config {text}: not a JSON object",
                              hint="give a config.json as saved by transformers")
    return spec_from_hf_config(data, text, str(path))


def shaped_spec(text: str) -> Optional[ModelSpec]:
    """The spec of a shape or an HF config path; ``None`` when ``text`` is neither."""
    if not is_shaped(text):
        return None
    if ":" in text and not text.endswith(".json"):
        return _from_overrides(text.strip())
    return _from_path(text)
