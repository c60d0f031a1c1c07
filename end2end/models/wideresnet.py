"""Wide ResNet (ResNet with Bottleneck blocks and a wider inner width), defined here because
torchvision cannot be installed next to the CPU torch of this project.

Module names and shapes follow torchvision's ``ResNet``/``Bottleneck`` so that schedules written
against torchvision paths (``layer3.7.conv2``, ``layer1.0.downsample.0``, ``fc``) work unchanged:
``conv1 bn1 relu maxpool layer1..layer4 avgpool fc``; each block has
``conv1 bn1 conv2 bn2 conv3 bn3 relu downsample`` and the stride sits on ``conv2`` (ResNet v1.5).
``wide_resnet50_2`` = ``WideResNet([3, 4, 6, 3], width_per_group=128)`` has 68,883,240
parameters, like torchvision's.

The paper's models (``wideresnet-250M`` ... ``wideresnet-4.6B``) all use layers ``[6, 8, 46, 6]``
with width_per_group 128 / 320 / 448 / 512 / 640; see ``end2end/models/build.py``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import nn

__all__ = ["Bottleneck", "WideResNet", "WideResNetForImageClassification", "ImageClassifierOutput"]


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (stride here) -> 1x1 expand (x4), plus the identity/downsample path."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: Optional[nn.Module] = None, width_per_group: int = 64):
        super().__init__()
        width = int(planes * (width_per_group / 64.0))
        self.conv1 = nn.Conv2d(inplanes, width, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class WideResNet(nn.Module):
    """ResNet-Bottleneck image classifier with a configurable ``width_per_group``."""

    def __init__(self, layers: Sequence[int], width_per_group: int = 64,
                 num_classes: int = 1000):
        super().__init__()
        if len(layers) != 4 or any(int(n) < 1 for n in layers):
            raise ValueError(f"layers must be 4 positive block counts, got {list(layers)}")
        self.width_per_group = width_per_group
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0], stride=1)
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)
        self._init_weights()

    def _make_layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        out = planes * Bottleneck.expansion
        downsample = None
        if stride != 1 or self.inplanes != out:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, out, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out),
            )
        mods = [Bottleneck(self.inplanes, planes, stride, downsample, self.width_per_group)]
        self.inplanes = out
        mods += [Bottleneck(out, planes, width_per_group=self.width_per_group)
                 for _ in range(1, blocks)]
        return nn.Sequential(*mods)

    def _init_weights(self) -> None:
        if any(p.is_meta for p in self.parameters()):
            return  # nothing to initialise on the meta device
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


@dataclass
class ImageClassifierOutput:
    """What :class:`WideResNetForImageClassification` returns (``.loss`` like HF outputs)."""

    loss: Optional[torch.Tensor]
    logits: torch.Tensor


class WideResNetForImageClassification(nn.Module):
    """``WideResNet`` plus cross-entropy, so a training step is ``model(**batch).loss`` as for
    the HF models. The network lives at ``.model`` (paths ``model.layer1.0.conv1`` ...)."""

    def __init__(self, layers: Sequence[int], width_per_group: int = 64,
                 num_classes: int = 1000):
        super().__init__()
        self.model = WideResNet(layers, width_per_group, num_classes)
        self.loss_fn = nn.CrossEntropyLoss()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None) -> None:
        """HF's API for the baselines' ``CKPT`` (``end2end.driver.runtimes.prepare_hf_model``):
        every residual block recomputed in the backward (``torch.utils.checkpoint``,
        non-reentrant unless the kwargs say otherwise), as HF models checkpoint each layer."""
        from torch.utils.checkpoint import checkpoint

        kwargs = {"use_reentrant": False, **(gradient_checkpointing_kwargs or {})}
        net = self.model
        for block in (b for stage in (net.layer1, net.layer2, net.layer3, net.layer4)
                      for b in stage):
            if not getattr(block, "_checkpointed", False):
                block.forward = functools.partial(checkpoint, block.forward, **kwargs)
                block._checkpointed = True

    def forward(self, pixel_values: torch.Tensor,
                labels: Optional[torch.Tensor] = None) -> ImageClassifierOutput:
        logits = self.model(pixel_values)
        loss = self.loss_fn(logits, labels) if labels is not None else None
        return ImageClassifierOutput(loss=loss, logits=logits)
