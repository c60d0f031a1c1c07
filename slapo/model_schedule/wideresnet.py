"""WideResNet (torchvision-style ``ResNet`` of ``Bottleneck`` blocks, e.g.
``end2end.models.wideresnet.WideResNetForImageClassification``; backbone ``model`` or the root).

No attention to replace. TP per block ``layerK.i`` (Megatron-style over channels):
``conv1`` output channels + ``bn1`` (column, input gradient all-reduced), ``conv2`` input
channels (row, output all-reduced), ``conv3`` output channels, all-gathered on the channel axis
before ``bn3`` (column, input gradient all-reduced); stem, downsample and ``fc`` stay replicated.
Checkpointing: ``checkpoint_layer_ids(n_K, ckpt_ratio)`` blocks of each stage, recomputed with
the BatchNorm running statistics restored (a plain checkpoint would update them twice); a
selective ``ckpt_policy`` is refused (no matmuls or attention to keep).

``fuse_conv_bn=True`` (inference; the model must be in eval mode, else ``ConfigError``): every
conv + BatchNorm pair (stem, ``convK``/``bnK`` of each block, ``downsample.0``/``.1``) becomes one
convolution with the folded weight and bias (:func:`slapo.op.conv_bn.fuse_conv_bn`, computed in
float64), the BatchNorm an ``nn.Identity``. The fold happens before sharding, so under TP the
fused ``conv1``/``conv3`` are sharded with their bias on the output channels; ``conv2`` is
sharded on its input channels (a partial sum), so its folded bias goes into ``bn2``'s slot as a
:class:`~slapo.op.conv_bn.ChannelBias`, added once after the all-reduce.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import ConfigError
from ..runtime.forward_wrap import install_forward_wrapper
from ..op.conv_bn import fuse_conv_bn, fuse_conv_bn_split
from ..schedule import Schedule
from . import common as C
from .checkpointing import BufferSafeCheckpoint
from .config import ScheduleConfig, checkpoint_layer_ids
from .registry import register_model_schedule


def check_eval_mode(sch: Schedule) -> None:
    """``fuse_conv_bn`` folds running statistics: refuse a BatchNorm in training mode or on the
    meta device."""
    call = "apply_schedule('wideresnet', fuse_conv_bn=True)"
    for path, mod in sch.mod.named_modules():
        if not isinstance(mod, nn.modules.batchnorm._BatchNorm):
            continue
        where = C.join(sch.path, path)
        if mod.training:
            raise ConfigError(
                "the model is in training mode: its BatchNorms normalise with batch statistics, "
                "so folding them into the convolutions would change the results", call=call,
                path=where, module=mod, hint="call model.eval() before apply_schedule (conv+BN "
                "fusion is for inference), or drop fuse_conv_bn")
        if mod.running_mean is None or mod.running_mean.is_meta:
            raise ConfigError(
                "the BatchNorm has no running statistics to fold (none tracked, or still on the "
                "meta device)", call=call, path=where, module=mod,
                hint="materialise / load the trained weights first, or drop fuse_conv_bn")


def fuse_pair(sch: Schedule, conv: str, bn: str, *, bias_after: bool = False) -> None:
    """Replace ``conv`` by the conv+BN fold and ``bn`` by ``nn.Identity`` (``bias_after``: by a
    ``ChannelBias`` adding the folded bias, the convolution staying bias-free)."""
    if bias_after:
        new, add_bias = fuse_conv_bn_split(sch[conv].mod, sch[bn].mod)
    else:
        new, add_bias = fuse_conv_bn(sch[conv].mod, sch[bn].mod), nn.Identity()
    sch[conv].replace(new)
    sch[bn].replace(add_bias)


def fuse_bottleneck(sch: Schedule, block: str, tp: bool) -> None:
    """Fold the three conv+BN pairs (and the downsample's) of ``block``."""
    for k in (1, 2, 3):
        fuse_pair(sch, f"{block}.conv{k}", f"{block}.bn{k}", bias_after=tp and k == 2)
    if f"{block}.downsample.1" in sch:
        fuse_pair(sch, f"{block}.downsample.0", f"{block}.downsample.1")


def shard_bottleneck(sch: Schedule, block: str, fused: bool = False) -> None:
    """Channel-parallel Bottleneck (see the module docs)."""
    if fused:
        sch[f"{block}.conv1"].shard(["weight", "bias"], axis=0)
    else:
        sch[f"{block}.conv1"].shard("weight", axis=0)
        sch[f"{block}.bn1"].shard(["weight", "bias", "running_mean", "running_var"], axis=0)
    sch[f"{block}.conv1"].sync("bwd_post", "all_reduce")
    sch[f"{block}.conv2"].shard("weight", axis=1)
    sch[f"{block}.conv2"].sync("fwd_post", "all_reduce")
    sch[f"{block}.conv3"].shard(["weight", "bias"] if fused else "weight", axis=0)
    sch[f"{block}.conv3"].sync("fwd_post", "all_gather", axis=-3)
    sch[f"{block}.conv3"].sync("bwd_post", "all_reduce")


@register_model_schedule("wideresnet", extra_knobs=("example_inputs", "fuse_conv_bn"))
def schedule_wideresnet(sch: Schedule, model_config: Any, cfg: ScheduleConfig,
                        example_inputs: Any = None, fuse_conv_bn: bool = False) -> None:
    """WideResNet; see the module docs."""
    if cfg.ckpt_policy:
        raise ConfigError(f"ckpt_policy {cfg.ckpt_policy!r} is not supported by the WideResNet "
                          "schedule", call="apply_schedule", hint="a convolutional network has "
                          "no matmuls or attention to keep: use ckpt_ratio alone")
    mode = C.tp_mode(sch, cfg, "wideresnet")
    p = C.backbone(sch, cfg, "layer1", ("model", ""), "wideresnet")
    if fuse_conv_bn:
        check_eval_mode(sch)
        fuse_pair(sch, C.join(p, "conv1"), C.join(p, "bn1"))
    stages = [C.layer_paths(sch, C.join(p, f"layer{k}")) for k in range(1, 5)]
    for blocks in stages:
        for block in blocks:
            if fuse_conv_bn:
                fuse_bottleneck(sch, block, mode.tp)
            if mode.tp:
                shard_bottleneck(sch, block, fused=fuse_conv_bn)
        for i in checkpoint_layer_ids(len(blocks), cfg.ckpt_ratio):
            mod = sch[blocks[i]].mod
            install_forward_wrapper(mod, "checkpoint", BufferSafeCheckpoint(mod))
            sch[blocks[i]].metadata["checkpoint"] = True
    C.cut_pipeline(sch, cfg, stages, "wideresnet", example_inputs)
