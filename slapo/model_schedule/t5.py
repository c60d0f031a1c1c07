"""T5 (``T5ForConditionalGeneration``): encoder-decoder, relative position bias, cross
attention.

Per block: ``{encoder,decoder}.block.N.layer.0.SelfAttention`` -> op-library
``HFT5Attention`` (unscaled scores, relative position bias added to the mask, causal in the
decoder; fused QKV with ``fuse``); ``decoder.block.N.layer.1.EncDecAttention`` -> the same,
cross (never fused); every ``T5LayerNorm`` -> the op library's one-function ``RMSNorm`` with
``fuse``. ``use_cache`` off. TP: heads (the relative-bias embedding is sharded on its
head axis), cross attention with q and k/v column-parallel (the encoder output's gradient is
all-reduced too), MLP ``DenseReluDense.wi`` (or gated ``wi_0``/``wi_1``) / ``wo`` (the
dropout between them, on the sharded activation, draws per-rank masks: ``fork_rng``),
vocab-parallel ``shared`` (and its tied copies) and ``lm_head``, with the seq2seq loss computed
on the vocab-sharded logits (:class:`slapo.op.lm_loss.VocabParallelLMLoss`; knob
``vocab_parallel_loss=False`` all-gathers them for HF's loss). Checkpointing:
``checkpoint_layer_ids`` of each stack.
"""

from __future__ import annotations

from typing import Any, List

from ..schedule import Schedule
from . import common as C
from .config import ScheduleConfig
from .registry import register_model_schedule


def _plan(sch: Schedule, block: str, ff: int) -> C.LayerPlan:
    mlp = f"layer.{ff}.DenseReluDense"
    gated = "wi_0" in sch[f"{block}.{mlp}"].child
    column = (f"{mlp}.wi_0", f"{mlp}.wi_1") if gated else (f"{mlp}.wi",)
    return C.LayerPlan(attn="layer.0.SelfAttention", column=column, row=f"{mlp}.wo",
                       grad_entry=mlp if gated else None, act=f"{mlp}.act")


@register_model_schedule("t5", extra_knobs=("example_inputs",))
def schedule_t5(sch: Schedule, model_config: Any, cfg: ScheduleConfig,
                example_inputs: Any = None) -> None:
    """T5; see the module docs."""
    mode = C.tp_mode(sch, cfg, "t5")
    C.disable_kv_cache(sch, model_config)
    p = C.backbone(sch, cfg, "encoder.block", ("",), "t5")
    stacks: List[List[str]] = []
    for stack, ff in (("encoder", 1), ("decoder", 2)):
        blocks = C.layer_paths(sch, C.join(p, stack, "block")) if C.join(p, stack) in sch else []
        for block in blocks:
            C.schedule_layers(sch, cfg, mode, [block], _plan(sch, block, ff))
            ffn_dropout = f"{block}.layer.{ff}.DenseReluDense.dropout"
            if mode.tp and ffn_dropout in sch and sch[ffn_dropout].mod.p > 0:
                # on the d_ff-sharded activation: each rank draws its own masks
                sch[ffn_dropout].fork_rng()
            if ff == 2 and C.replace_attention(sch, f"{block}.layer.1.EncDecAttention", cfg,
                                               fused_qkv=False) and mode.tp:
                C.shard_attention(sch, f"{block}.layer.1.EncDecAttention", mode)
        stacks.append(blocks)
    if cfg.fuse:
        C.fuse_rms_norms(sch)
    if mode.tp and cfg.shard_embedding:
        C.shard_embedding(sch, [C.join(p, n) for n in
                                ("shared", "encoder.embed_tokens", "decoder.embed_tokens")
                                if C.join(p, n) in sch])
        if "lm_head" in sch:
            C.shard_lm_head(sch, "lm_head", mode, cfg, loss="seq2seq")
    for blocks in stacks:
        C.checkpoint_layers(sch, blocks, cfg.ckpt_ratio, cfg.ckpt_policy)
    C.cut_pipeline(sch, cfg, [s for s in stacks if s], "t5", example_inputs)
