"""Linear layers with their tensor-parallel collective built in.

``LinearWithSync``: a row-parallel linear layer whose bias is added once, after the reduction.
A Linear (or HF ``Conv1D``) sharded on its input features computes a *partial* product on each
rank. Its bias must be added to the *reduced* sum, otherwise it is counted ``world_size`` times.
``sync('fwd_post', 'all_reduce' | 'reduce_scatter')`` on such a module swaps it (same position,
same ``weight``/``bias`` Parameter objects, so state-dict keys, shard specs, tags and optimizer
references are unchanged) for this module, whose forward is ``sync_fn(x @ W^T) + bias``.
"""

from __future__ import annotations

import copy
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..sharding.collectives import group_size

__all__ = ["LinearWithSync", "LinearWithGradSync", "linear_with_grad_all_reduce"]


class LinearWithSync(nn.Module):
    """``sync_fn(matmul(x, weight)) + bias``.

    Args:
        weight: ``[out, in]`` (``nn.Linear`` layout) or, with ``transposed=True``, ``[in, out]``
            (HF ``Conv1D`` layout). The Parameter object is reused, not copied.
        bias: ``[out]`` or ``None`` (reused as well).
        sync_fn: applied to the bias-free product (e.g. an all-reduce); identity if ``None``.
        transposed: the weight is stored ``[in, out]``.

    A tracing leaf (``_slapo_leaf``): its ``sync_fn`` is a collective on real tensors.
    """

    _slapo_leaf = True

    def __init__(self, weight: nn.Parameter, bias: Optional[nn.Parameter],
                 sync_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, *,
                 transposed: bool = False):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.sync_fn = sync_fn
        self.transposed = transposed
        self.in_features, self.out_features = (
            weight.shape if transposed else (weight.shape[1], weight.shape[0]))

    @classmethod
    def from_module(cls, mod: nn.Module, sync_fn: Optional[Callable] = None) -> "LinearWithSync":
        """Build from an ``nn.Linear`` or HF ``Conv1D`` (sharing its Parameters)."""
        transposed = not isinstance(mod, nn.Linear)
        new = cls(mod.weight, mod.bias, sync_fn, transposed=transposed)
        return new.train(mod.training)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.transposed:
            out = torch.matmul(input, self.weight)
        else:
            out = F.linear(input, self.weight)
        if self.sync_fn is not None:
            out = self.sync_fn(out)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        sync = getattr(self.sync_fn, "__name__", None) or repr(self.sync_fn)
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, transposed={self.transposed}, sync={sync}")


class _LinearGradAllReduce(torch.autograd.Function):
    """``x @ W^T + b`` whose backward all-reduces ``dL/dx`` over ``group`` while it computes
    ``dL/dW`` and ``dL/db``. Under autocast the inputs are cast as ``F.linear`` would cast them
    and the backward computes in that dtype (autograd casts the gradients to the inputs')."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, transposed):
        device = x.device.type
        if torch.is_autocast_enabled(device):  # run (and save) in the autocast dtype, as
            dtype = torch.get_autocast_dtype(device)  # F.linear would; backward follows it
            x, weight = x.to(dtype), weight.to(dtype)
            bias = None if bias is None else bias.to(dtype)
        with torch.autocast(device, enabled=False):
            out = torch.matmul(x, weight) if transposed else F.linear(x, weight)
            out = out if bias is None else out + bias
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.transposed, ctx.has_bias = group, transposed, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad = grad.to(x.dtype)
        grad_x = grad_w = grad_b = handle = None
        if need_x:
            grad_x = torch.matmul(grad, weight.t() if ctx.transposed else weight)
            if group_size(ctx.group) > 1:
                handle = dist.all_reduce(grad_x, group=ctx.group, async_op=True)
        if need_w or (need_b and ctx.has_bias):
            flat_grad = grad.reshape(-1, grad.shape[-1])
            if need_w:
                flat_x = x.reshape(-1, x.shape[-1])
                grad_w = flat_x.t().mm(flat_grad) if ctx.transposed else flat_grad.t().mm(flat_x)
            if need_b and ctx.has_bias:
                grad_b = flat_grad.sum(0)
        if handle is not None:
            handle.wait()
        return grad_x, grad_w, grad_b, None, None


def linear_with_grad_all_reduce(x: torch.Tensor, weight: torch.Tensor,
                                bias: Optional[torch.Tensor] = None, group=None, *,
                                transposed: bool = False) -> torch.Tensor:
    """``x @ W^T + b`` (``x @ W + b`` with ``transposed``) with the input gradient summed over
    ``group`` in the backward, overlapped with the weight-gradient GEMM. Identity sync without
    an initialised process group or with one rank."""
    return _LinearGradAllReduce.apply(x, weight, bias, group, transposed)


class LinearWithGradSync(nn.Module):
    """A column-parallel ``nn.Linear`` / HF ``Conv1D`` (``transposed``) whose input gradient is
    all-reduced over ``group`` asynchronously, overlapped with its weight-gradient GEMM (as
    Megatron-LM's column-parallel layers do). Parameters are reused, not copied; a tracing leaf.
    """

    _slapo_leaf = True

    def __init__(self, weight: nn.Parameter, bias: Optional[nn.Parameter], group=None, *,
                 transposed: bool = False):
        super().__init__()
        self.weight, self.bias = weight, bias
        self.group, self.transposed = group, transposed
        self.in_features, self.out_features = (
            weight.shape if transposed else (weight.shape[1], weight.shape[0]))

    @classmethod
    def from_module(cls, mod: nn.Module, group=None) -> "LinearWithGradSync":
        """Build from an ``nn.Linear`` or HF ``Conv1D`` (sharing its Parameters)."""
        new = cls(mod.weight, mod.bias, group, transposed=not isinstance(mod, nn.Linear))
        return new.train(mod.training)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return linear_with_grad_all_reduce(input, self.weight, self.bias, self.group,
                                           transposed=self.transposed)

    def __deepcopy__(self, memo: dict) -> "LinearWithGradSync":
        memo[id(self.group)] = self.group  # the process group is shared, not copied
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, transposed={self.transposed}, "
                "sync=identity_forward_all_reduce_backward (overlapped)")
