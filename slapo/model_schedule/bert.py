"""BERT and RoBERTa (``BertForMaskedLM``, ``BertLMHeadModel``, ``RobertaForMaskedLM`` ...).

Per layer ``{bert,roberta}.encoder.layer.N``: ``attention.self`` -> op-library SDPA attention
(non-causal for encoders, causal for ``is_decoder`` models: the HF module's flag is kept; fused
QKV with ``fuse``); bias+GeLU fused in ``intermediate`` with the knob ``fuse_bias_gelu``; the
dense bias decomposed and fused with dropout+residual+LayerNorm in ``attention.output`` and
``output`` with the knob ``fuse_bias_dropout_ln`` (True: inductor, a backend name, "eager").
TP: heads column/row (``attention.self`` / ``attention.output.dense``), MLP
``intermediate.dense`` / ``output.dense``, vocab-parallel word embedding and tied decoder with
the loss computed on the vocab-sharded logits (masked LM: :class:`slapo.op.lm_loss.
VocabParallelLMLoss`; ``BertLMHeadModel``: the vocab-parallel causal loss); knob
``vocab_parallel_loss=False`` all-gathers the logits for HF's own loss instead.
"""

from __future__ import annotations

from typing import Any

from ..schedule import Schedule
from . import common as C
from .config import ScheduleConfig
from .registry import register_model_schedule

KNOBS = ("fuse_bias_gelu", "fuse_bias_dropout_ln", "example_inputs")
PLAN = C.LayerPlan(attn="attention.self", attn_out="attention.output.dense",
                   column=("intermediate.dense",), row="output.dense", mlp="intermediate")


def schedule_bert_like(sch: Schedule, model_config: Any, cfg: ScheduleConfig, family: str,
                       fuse_bias_gelu: Any = False, fuse_bias_dropout_ln: Any = False,
                       example_inputs: Any = None) -> None:
    """The BERT recipe (RoBERTa shares it; only the prefix and head paths differ)."""
    mode = C.tp_mode(sch, cfg, family)
    p = C.backbone(sch, cfg, "encoder.layer", ("bert", "roberta", ""), family)
    causal = bool(getattr(sch.mod.config, "is_decoder", False))
    if causal:
        C.disable_kv_cache(sch, model_config)
    layers = C.layer_paths(sch, C.join(p, "encoder.layer"))
    for path in (f"{layer}.{s}" for layer in layers for s in ("attention.output", "output")):
        C.replace_residual_norm(sch, path, cfg, fuse_bias_dropout_ln)
    C.schedule_layers(sch, cfg, mode, layers, PLAN, fuse_bias_gelu=fuse_bias_gelu)
    if mode.tp and cfg.shard_embedding:
        C.shard_embedding(sch, [C.join(p, "embeddings.word_embeddings")])
        head = "cls.predictions.decoder" if "cls.predictions.decoder" in sch else "lm_head.decoder"
        if head in sch:
            C.shard_lm_head(sch, head, mode, cfg, loss="causal" if causal else "masked")
    C.checkpoint_layers(sch, layers, cfg.ckpt_ratio, cfg.ckpt_policy)
    C.cut_pipeline(sch, cfg, [layers], family, example_inputs)


@register_model_schedule("bert", extra_knobs=KNOBS)
def schedule_bert(sch: Schedule, model_config: Any, cfg: ScheduleConfig, **extra: Any) -> None:
    """BERT; see the module docs."""
    schedule_bert_like(sch, model_config, cfg, "bert", **extra)


@register_model_schedule("roberta", extra_knobs=KNOBS)
def schedule_roberta(sch: Schedule, model_config: Any, cfg: ScheduleConfig,
                     **extra: Any) -> None:
    """RoBERTa: the BERT recipe under the ``roberta`` prefix with ``lm_head.decoder``."""
    schedule_bert_like(sch, model_config, cfg, "roberta", **extra)
