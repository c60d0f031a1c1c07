"""ALBERT (``AlbertForMaskedLM``; backbone ``albert``): one layer's weights shared by all layers.

The shared layer ``albert.encoder.albert_layer_groups.G.albert_layers.0``: ``attention`` ->
op-library ``HFAlbertAttention``, which keeps HF's output projection, dropout, residual and
LayerNorm (the original dropped the residual+LayerNorm and made the attention causal; not here:
non-causal, as HF). TP: heads (``attention``), MLP ``ffn`` (column) / ``ffn_output`` (row),
vocab-parallel word embedding and tied ``predictions.decoder`` (masked-LM loss on the
vocab-sharded logits, :class:`slapo.op.lm_loss.VocabParallelLMLoss`). Checkpointing: the layer
group is *called* L times; exactly the calls ``checkpoint_layer_ids(L, ckpt_ratio)`` are
recomputed (all calls: ``checkpoint()`` on the
group; some: :class:`~slapo.model_schedule.checkpointing.CheckpointCalls`).
"""

from __future__ import annotations

from typing import Any

from ..schedule import Schedule
from . import common as C
from .checkpointing import checkpoint_shared_layers
from .config import ScheduleConfig
from .registry import register_model_schedule

PLAN = C.LayerPlan(attn="attention", column=("ffn",), row="ffn_output")


@register_model_schedule("albert", extra_knobs=("example_inputs",))
def schedule_albert(sch: Schedule, model_config: Any, cfg: ScheduleConfig,
                    example_inputs: Any = None) -> None:
    """ALBERT; see the module docs."""
    mode = C.tp_mode(sch, cfg, "albert")
    p = C.backbone(sch, cfg, "encoder.albert_layer_groups", ("albert", ""), "albert")
    encoder = C.join(p, "encoder")
    layers = [f"{g}.albert_layers.{i}"
              for g in C.layer_paths(sch, C.join(encoder, "albert_layer_groups"))
              for i in sch[f"{g}.albert_layers"].child]
    C.schedule_layers(sch, cfg, mode, layers, PLAN)
    if mode.tp and cfg.shard_embedding:
        C.shard_embedding(sch, [C.join(p, "embeddings.word_embeddings")])
        if "predictions.decoder" in sch:
            C.shard_lm_head(sch, "predictions.decoder", mode, cfg, loss="masked")
    checkpoint_shared_layers(sch, encoder, sch.mod.config.num_hidden_layers, cfg.ckpt_ratio,
                             cfg.ckpt_policy)
    C.cut_pipeline(sch, cfg, [], "albert", example_inputs)
