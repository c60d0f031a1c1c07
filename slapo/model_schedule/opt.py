"""OPT (``OPTForCausalLM``; backbone ``model.decoder``).

Per layer ``model.decoder.layers.N``: ``self_attn`` -> op-library SDPA attention (causal,
fused QKV with ``fuse``); ``use_cache`` off. TP: heads, MLP ``fc1`` (column) / ``fc2`` (row),
vocab-parallel ``embed_tokens`` and tied ``lm_head`` with the vocab-parallel causal loss. The
pipeline cuts address ``model.decoder.layers.N`` (the original cut a non-existent ``h.N``).
"""

from __future__ import annotations

from typing import Any

from ..schedule import Schedule
from . import common as C
from .config import ScheduleConfig
from .registry import register_model_schedule

PLAN = C.LayerPlan(attn="self_attn", column=("fc1",), row="fc2")


@register_model_schedule("opt", extra_knobs=("example_inputs",))
def schedule_opt(sch: Schedule, model_config: Any, cfg: ScheduleConfig,
                   example_inputs: Any = None) -> None:
    """OPT; see the module docs."""
    mode = C.tp_mode(sch, cfg, "opt")
    C.disable_kv_cache(sch, model_config)
    p = C.backbone(sch, cfg, "layers", ("model.decoder", "decoder", ""), "opt")
    layers = C.layer_paths(sch, C.join(p, "layers"))
    C.schedule_layers(sch, cfg, mode, layers, PLAN)
    if mode.tp and cfg.shard_embedding:
        C.shard_embedding(sch, [C.join(p, "embed_tokens")])
        if "lm_head" in sch:
            C.shard_lm_head(sch, "lm_head", mode, cfg, loss="causal")
    C.checkpoint_layers(sch, layers, cfg.ckpt_ratio, cfg.ckpt_policy)
    C.cut_pipeline(sch, cfg, [layers], "opt", example_inputs)
