"""Convolution + BatchNorm folding for inference.

In eval mode, ``BatchNorm(conv(x))`` is an affine map per output channel ``c``::

    bn(y)[c] = (y[c] - running_mean[c]) * gamma[c] / sqrt(running_var[c] + eps) + beta[c]

so it folds into the convolution: ``W'[c] = W[c] * s[c]`` and ``b'[c] = (b[c] - mean[c]) * s[c]
+ beta[c]`` with ``s = gamma / sqrt(var + eps)``. The fold is computed in float64 and cast back
to the convolution's dtype, so the fused layer matches ``conv -> bn`` up to one rounding.

* :func:`fuse_conv_bn`: a new convolution (same class, stride, padding, dilation, groups,
  padding mode) with the folded weight and bias.
* :func:`fuse_conv_bn_split`: the folded weight in a bias-free convolution plus a
  :class:`ChannelBias` that adds the folded bias; for a convolution sharded on its *input*
  channels, whose partial output must be reduced before the bias is added once.
* :func:`fold_conv_bn`: the folded ``(weight, bias)`` tensors.

Training-mode BatchNorm normalises with the statistics of each batch, which no fixed convolution
reproduces: these functions refuse a BatchNorm in training mode or without running statistics.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from ..errors import OpError

__all__ = ["fold_conv_bn", "fuse_conv_bn", "fuse_conv_bn_split", "ChannelBias"]

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _check(conv: nn.Module, bn: nn.Module, call: str) -> None:
    if not isinstance(conv, _CONVS):
        raise OpError(f"expected an nn.Conv1d/2d/3d, got {type(conv).__name__}", call=call,
                      module=conv, hint="fold a BatchNorm into the convolution that feeds it")
    if not isinstance(bn, _NORMS):
        raise OpError(f"expected an nn.BatchNorm1d/2d/3d, got {type(bn).__name__}", call=call,
                      module=bn, hint="pass the BatchNorm that follows the convolution")
    if bn.training:
        raise OpError("the BatchNorm is in training mode: it normalises with batch statistics, "
                      "which a fused convolution cannot reproduce", call=call, module=bn,
                      hint="call model.eval() first; fold only for inference")
    if bn.running_mean is None or bn.running_var is None:
        raise OpError("the BatchNorm has no running statistics (track_running_stats=False), so "
                      "it always uses batch statistics", call=call, module=bn,
                      hint="fold only BatchNorms that track running statistics")
    if bn.num_features != conv.out_channels or bn.running_mean.numel() != conv.weight.shape[0]:
        raise OpError(f"the BatchNorm has {bn.running_mean.numel()} channels but the "
                      f"convolution produces {conv.weight.shape[0]}", call=call, module=conv,
                      hint="pair each convolution with the BatchNorm applied to its output")
    if conv.weight.is_meta or bn.running_mean.is_meta:
        raise OpError("the weights are on the meta device; folding needs their values",
                      call=call, module=conv, hint="materialise the model first")


def fold_conv_bn(weight: torch.Tensor, bias: Optional[torch.Tensor],
                 bn: nn.Module) -> Tuple[torch.Tensor, torch.Tensor]:
    """The folded ``(weight, bias)`` of ``bn(conv(x))`` for a convolution with ``weight``
    (``[out, in/groups, *kernel]``) and ``bias`` (``[out]`` or ``None``); computed in float64,
    returned in ``weight``'s dtype. ``bn`` must be in eval mode (not checked here)."""
    dtype = weight.dtype
    f64 = dict(dtype=torch.float64)
    with torch.no_grad():
        var = bn.running_var.to(**f64)
        mean = bn.running_mean.to(**f64)
        gamma = bn.weight.to(**f64) if bn.weight is not None else torch.ones_like(var)
        beta = bn.bias.to(**f64) if bn.bias is not None else torch.zeros_like(var)
        scale = gamma / torch.sqrt(var + bn.eps)
        b = bias.to(**f64) if bias is not None else torch.zeros_like(var)
        w = weight.to(**f64) * scale.reshape(-1, *([1] * (weight.dim() - 1)))
        return w.to(dtype), ((b - mean) * scale + beta).to(dtype)


def _new_conv(conv: nn.Module, bias: bool) -> nn.Module:
    new = type(conv)(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                     padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                     bias=bias, padding_mode=conv.padding_mode, device=conv.weight.device,
                     dtype=conv.weight.dtype)
    return new.train(conv.training)


def fuse_conv_bn(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """A new convolution computing ``bn(conv(x))`` of an eval-mode ``bn`` (module docs).

    The inputs are not modified. Raises :class:`~slapo.errors.OpError` when ``bn`` is in
    training mode, has no running statistics, or does not match ``conv``'s output channels.
    """
    _check(conv, bn, "fuse_conv_bn")
    w, b = fold_conv_bn(conv.weight, conv.bias, bn)
    new = _new_conv(conv, bias=True)
    with torch.no_grad():
        new.weight.copy_(w)
        new.bias.copy_(b)
    return new


def fuse_conv_bn_split(conv: nn.Module, bn: nn.Module) -> Tuple[nn.Module, "ChannelBias"]:
    """``(conv', add_bias)`` with ``add_bias(conv'(x)) == bn(conv(x))``: ``conv'`` is bias-free
    (folded weight) and ``add_bias`` adds the folded bias. Use it where the convolution's output
    is a partial sum reduced before the bias (input-channel tensor parallelism). Same checks as
    :func:`fuse_conv_bn`."""
    _check(conv, bn, "fuse_conv_bn_split")
    w, b = fold_conv_bn(conv.weight, conv.bias, bn)
    new = _new_conv(conv, bias=False)
    with torch.no_grad():
        new.weight.copy_(w)
    return new, ChannelBias(b, channel_dim=1).train(conv.training)


class ChannelBias(nn.Module):
    """``x + bias`` broadcast along ``channel_dim`` (1 = the ``C`` of ``N, C, ...``)."""

    def __init__(self, bias: torch.Tensor, channel_dim: int = 1):
        super().__init__()
        self.bias = nn.Parameter(bias.detach().clone())
        self.channel_dim = channel_dim

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        shape = [1] * input.dim()
        shape[self.channel_dim] = -1
        return input + self.bias.reshape(shape)

    def extra_repr(self) -> str:
        return f"channels={self.bias.numel()}, channel_dim={self.channel_dim}"
