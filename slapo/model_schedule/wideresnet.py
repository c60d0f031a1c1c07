"""WideResNet (torchvision-style ``ResNet`` of ``Bottleneck`` blocks, e.g.
``end2end.wideresnet.WideResNetForImageClassification``; backbone ``model`` or the root).

No attention to replace. TP per block ``layerK.i`` (Megatron-style over channels):
``conv1`` output channels + ``bn1`` (column, input gradient all-reduced), ``conv2`` input
channels (row, output all-reduced), ``conv3`` output channels, all-gathered on the channel axis
before ``bn3`` (column, input gradient all-reduced); stem, downsample and ``fc`` stay replicated.
Checkpointing: ``checkpoint_layer_ids(n_K, ckpt_ratio)`` blocks of each stage, recomputed with
the BatchNorm running statistics restored (a plain checkpoint would update them twice).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..activation_checkpoint import checkpoint as rng_exact_checkpoint
from ..forward_wrap import install_forward_wrapper
from ..schedule import Schedule
from . import common as C
from .config import ScheduleConfig, checkpoint_layer_ids
from .registry import register_model_schedule


class _RestoreBuffersOnRecompute:
    """Calls ``fn``; every later call (the recomputation) leaves ``module``'s buffers as they
    were, so BatchNorm running statistics are updated once per forward, as without
    checkpointing."""

    def __init__(self, fn: Any, module: nn.Module):
        self.fn, self.module, self.calls = fn, module, 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            return self.fn(*args)
        saved = [(b, b.detach().clone()) for b in self.module.buffers()]
        try:
            return self.fn(*args)
        finally:
            with torch.no_grad():
                for b, value in saved:
                    b.copy_(value)


class BufferSafeCheckpoint:
    """Forward wrapper: RNG-exact activation checkpointing that keeps buffers exact."""

    def __init__(self, module: nn.Module):
        self.module = module

    def __call__(self, inner: Any, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return inner(x)
        return rng_exact_checkpoint(_RestoreBuffersOnRecompute(inner, self.module), x)


def shard_bottleneck(sch: Schedule, block: str) -> None:
    """Channel-parallel Bottleneck (see the module docs)."""
    sch[f"{block}.conv1"].shard("weight", axis=0)
    sch[f"{block}.conv1"].sync("bwd_post", "all_reduce")
    sch[f"{block}.bn1"].shard(["weight", "bias", "running_mean", "running_var"], axis=0)
    sch[f"{block}.conv2"].shard("weight", axis=1)
    sch[f"{block}.conv2"].sync("fwd_post", "all_reduce")
    sch[f"{block}.conv3"].shard("weight", axis=0)
    sch[f"{block}.conv3"].sync("fwd_post", "all_gather", axis=-3)
    sch[f"{block}.conv3"].sync("bwd_post", "all_reduce")


@register_model_schedule("wideresnet", extra_knobs=("example_inputs",))
def schedule_wideresnet(sch: Schedule, model_config: Any, cfg: ScheduleConfig,
                        example_inputs: Any = None) -> None:
    """WideResNet; see the module docs."""
    mode = C.tp_mode(sch, cfg, "wideresnet", sp_supported=False)
    p = C.backbone(sch, cfg, "layer1", ("model", ""), "wideresnet")
    stages = [C.layer_paths(sch, C.join(p, f"layer{k}")) for k in range(1, 5)]
    for blocks in stages:
        for block in blocks:
            if mode.tp:
                shard_bottleneck(sch, block)
        for i in checkpoint_layer_ids(len(blocks), cfg.ckpt_ratio):
            mod = sch[blocks[i]].mod
            install_forward_wrapper(mod, "checkpoint", BufferSafeCheckpoint(mod))
            sch[blocks[i]].metadata["checkpoint"] = True
    C.cut_pipeline(sch, cfg, stages, "wideresnet", example_inputs)
