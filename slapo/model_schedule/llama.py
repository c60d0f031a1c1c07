"""LLaMA (``LlamaForCausalLM``; backbone ``model``): RoPE, grouped-query attention, RMSNorm,
gated SiLU MLP.

Per layer ``model.layers.N``: ``self_attn`` -> op-library SDPA attention (rotary cos/sin from
the model's ``rotary_emb``, GQA; fused QKV with ``fuse``, grouped per kv head so a TP shard
keeps whole groups); RMSNorms -> the op library's one-function ``RMSNorm`` with ``fuse``;
``use_cache`` off. TP (the size must divide the kv heads): heads, MLP
``gate_proj``/``up_proj`` (column, one gradient all-reduce at ``mlp``) / ``down_proj`` (row),
vocab-parallel ``embed_tokens``, ``lm_head`` (untied by default) with the vocab-parallel causal
loss. Sequence parallelism as for GPT-2 around ``input_layernorm``/``post_attention_layernorm``
and ``model.norm``.
"""

from __future__ import annotations

from typing import Any

from ..schedule import Schedule
from . import common as C
from .config import ScheduleConfig
from .registry import register_model_schedule

PLAN = C.LayerPlan(attn="self_attn", column=("mlp.gate_proj", "mlp.up_proj"),
                   row="mlp.down_proj", grad_entry="mlp",
                   norms=("input_layernorm", "post_attention_layernorm"))


@register_model_schedule("llama", extra_knobs=("example_inputs",), sequence_parallel=True)
def schedule_llama(sch: Schedule, model_config: Any, cfg: ScheduleConfig,
                   example_inputs: Any = None) -> None:
    """LLaMA; see the module docs."""
    mode = C.tp_mode(sch, cfg, "llama")
    C.disable_kv_cache(sch, model_config)
    p = C.backbone(sch, cfg, "layers", ("model", ""), "llama")
    layers = C.layer_paths(sch, C.join(p, "layers"))
    C.schedule_layers(sch, cfg, mode, layers, PLAN)
    if cfg.fuse:
        C.fuse_rms_norms(sch)
    C.vocab_and_sequence_parallel(sch, cfg, mode, embedding=C.join(p, "embed_tokens"),
                                  lm_head="lm_head" if "lm_head" in sch else None,
                                  layers=layers, norms=PLAN.norms, final_norm=C.join(p, "norm"))
    C.checkpoint_layers(sch, layers, cfg.ckpt_ratio, cfg.ckpt_policy)
    C.cut_pipeline(sch, cfg, [layers], "llama", example_inputs)
