"""GPT-2 and GPT-Neo (``GPT2LMHeadModel``, ``GPTNeoForCausalLM``; backbone ``transformer``).

Per block ``transformer.h.N``: the attention (GPT-2 ``attn``, GPT-Neo ``attn.attention``, whose
local layers keep their window) -> op-library SDPA attention, causal, fused QKV with ``fuse``
(GPT-2's ``c_attn`` is re-laid per head); the MLP -> op-library ``MLP`` with bias+GeLU fused
when ``fuse_bias_gelu`` is set. ``use_cache`` is turned off (training).
TP: heads, MLP (``c_fc`` / ``c_proj``: HF Conv1D for GPT-2, Linear for GPT-Neo), vocab-parallel
``wte`` and tied ``lm_head`` with the vocab-parallel causal loss (logits stay vocab-sharded).
Sequence parallelism (``sequence_parallel``): the first block's input is split along the
sequence; ``ln_1``/``ln_2``/``ln_f`` all-gather it, the row-parallel projections
reduce-scatter; the norms' replicated gradients are summed over the TP group in backward (the
``all_reduce_grads`` hooks of ``mark_replicated``): no call in the training loop.
"""

from __future__ import annotations

from typing import Any

from ..schedule import Schedule
from . import common as C
from .config import ScheduleConfig
from .registry import register_model_schedule


def schedule_gpt_like(sch: Schedule, model_config: Any, cfg: ScheduleConfig, family: str,
                      attn: str, fuse_bias_gelu: Any = False,
                      example_inputs: Any = None) -> None:
    """The GPT-2 recipe; GPT-Neo differs only in the attention's sub-path."""
    mode = C.tp_mode(sch, cfg, family)
    C.disable_kv_cache(sch, model_config)
    p = C.backbone(sch, cfg, "h", ("transformer", ""), family)
    layers = C.layer_paths(sch, C.join(p, "h"))
    plan = C.LayerPlan(attn=attn, column=("mlp.c_fc",), row="mlp.c_proj", mlp="mlp",
                       act="mlp.act", norms=("ln_1", "ln_2"))
    C.schedule_layers(sch, cfg, mode, layers, plan, fuse_bias_gelu=fuse_bias_gelu)
    if cfg.attn_kernel != "eager":
        C.sdpa_masks(sch, model_config)
    C.vocab_and_sequence_parallel(sch, cfg, mode, embedding=C.join(p, "wte"),
                                  lm_head="lm_head" if "lm_head" in sch else None,
                                  layers=layers, norms=plan.norms, final_norm=C.join(p, "ln_f"))
    C.checkpoint_layers(sch, layers, cfg.ckpt_ratio, cfg.ckpt_policy)
    C.cut_pipeline(sch, cfg, [layers], family, example_inputs)


@register_model_schedule("gpt2", extra_knobs=("fuse_bias_gelu", "example_inputs"),
                         sequence_parallel=True)
def schedule_gpt2(sch: Schedule, model_config: Any, cfg: ScheduleConfig, **extra: Any) -> None:
    """GPT-2; see the module docs."""
    schedule_gpt_like(sch, model_config, cfg, "gpt2", "attn", **extra)


@register_model_schedule("gpt_neo", extra_knobs=("fuse_bias_gelu", "example_inputs"),
                         sequence_parallel=True)
def schedule_gpt_neo(sch: Schedule, model_config: Any, cfg: ScheduleConfig,
                     **extra: Any) -> None:
    """GPT-Neo: the GPT-2 recipe with the attention at ``attn.attention``."""
    schedule_gpt_like(sch, model_config, cfg, "gpt_neo", "attn.attention", **extra)
