"""``LinearWithSync``: a row-parallel linear layer whose bias is added once, after the reduction.

A Linear (or HF ``Conv1D``) sharded on its input features computes a *partial* product on each
rank. Its bias must be added to the *reduced* sum, otherwise it is counted ``world_size`` times.
``sync('fwd_post', 'all_reduce' | 'reduce_scatter')`` on such a module swaps it (same position,
same ``weight``/``bias`` Parameter objects, so state-dict keys, shard specs, tags and optimizer
references are unchanged) for this module, whose forward is ``sync_fn(x @ W^T) + bias``.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LinearWithSync"]


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
