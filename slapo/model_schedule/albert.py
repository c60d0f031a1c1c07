"""ALBERT (``AlbertForMaskedLM``; backbone ``albert``): one layer's weights shared by all layers.

The shared layer ``albert.encoder.albert_layer_groups.G.albert_layers.0``: ``attention`` ->
op-library ``HFAlbertAttention``, which keeps HF's output projection, dropout, residual and
LayerNorm (the original dropped the residual+LayerNorm and made the attention causal; not here:
non-causal, as HF). TP: heads (``attention``), MLP ``ffn`` (column) / ``ffn_output`` (row),
vocab-parallel word embedding and tied ``predictions.decoder`` (logits all-gathered for HF's
masked-LM loss). Checkpointing: the layer group is *called* L times; exactly the calls
``checkpoint_layer_ids(L, ckpt_ratio)`` are recomputed (all calls: ``checkpoint()`` on the
group; some: :class:`CheckpointCalls`).
"""

from __future__ import annotations

from typing import Any, FrozenSet, List

import torch

from ..forward_wrap import install_forward_wrapper
from ..primitives.checkpoint import CheckpointForward
from ..schedule import Schedule
from . import common as C
from .config import ScheduleConfig, checkpoint_layer_ids
from .registry import register_model_schedule

PLAN = C.LayerPlan(attn="attention", column=("ffn",), row="ffn_output")


class CheckpointCalls:
    """Forward wrapper: checkpoint only the ``calls``-th calls (0-based) of a module that one
    model forward calls several times; :class:`ResetCalls` restarts the count per forward."""

    def __init__(self, calls: FrozenSet[int], path: str):
        self.calls, self.count = frozenset(calls), 0
        self.checkpoint = CheckpointForward(path)

    def __call__(self, inner: Any, *args: Any, **kwargs: Any) -> Any:
        index, self.count = self.count, self.count + 1
        if index in self.calls and torch.is_grad_enabled():
            return self.checkpoint(inner, *args, **kwargs)
        return inner(*args, **kwargs)


class ResetCalls:
    """Forward pre-hook of the module that makes the calls: restart every counter."""

    def __init__(self, wrappers: List[CheckpointCalls]):
        self.wrappers = wrappers

    def __call__(self, module: Any, args: Any) -> None:
        for w in self.wrappers:
            w.count = 0


def checkpoint_shared_layers(sch: Schedule, encoder: str, num_layers: int, ratio: float) -> None:
    """Checkpoint the calls ``checkpoint_layer_ids(num_layers, ratio)`` of the layer groups (HF
    calls group ``int(i / (L / G))`` for layer ``i``)."""
    groups = C.layer_paths(sch, C.join(encoder, "albert_layer_groups"))
    ids = checkpoint_layer_ids(num_layers, ratio)
    per_group = num_layers // len(groups)
    wrappers = []
    for g, path in enumerate(groups):
        calls = frozenset(i - g * per_group for i in ids if i // per_group == g)
        if len(calls) == per_group:
            sch[path].checkpoint()
        elif calls:
            wrappers.append(CheckpointCalls(calls, path))
            install_forward_wrapper(sch[path].mod, "checkpoint", wrappers[-1])
            sch[path].metadata["checkpoint"] = sorted(calls)
    if wrappers:
        sch[encoder].mod.register_forward_pre_hook(ResetCalls(wrappers))


@register_model_schedule("albert", extra_knobs=("example_inputs",))
def schedule_albert(sch: Schedule, model_config: Any, cfg: ScheduleConfig,
                    example_inputs: Any = None) -> None:
    """ALBERT; see the module docs."""
    mode = C.tp_mode(sch, cfg, "albert", sp_supported=False)
    p = C.backbone(sch, cfg, "encoder.albert_layer_groups", ("albert", ""), "albert")
    encoder = C.join(p, "encoder")
    layers = [f"{g}.albert_layers.{i}"
              for g in C.layer_paths(sch, C.join(encoder, "albert_layer_groups"))
              for i in sch[f"{g}.albert_layers"].child]
    C.schedule_layers(sch, cfg, mode, layers, PLAN)
    if mode.tp:
        C.shard_embedding(sch, [C.join(p, "embeddings.word_embeddings")])
        if "predictions.decoder" in sch:
            C.shard_lm_head(sch, "predictions.decoder", mode, gather_logits=True)
    checkpoint_shared_layers(sch, encoder, sch.mod.config.num_hidden_layers, cfg.ckpt_ratio)
    C.cut_pipeline(sch, cfg, [], "albert", example_inputs)
