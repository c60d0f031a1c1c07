"""Free what a pipeline rank does not run: the parameters and buffers of the other stages.

Every rank builds the whole model and cuts it into stages (:func:`slapo.pipeline.
build_pipeline_stages`); a rank then trains one stage. :func:`release_other_stages` empties the
storage of every parameter and buffer that only other stages use (a zero-element tensor of the
same dtype and device, so the original model, which shares the ``Parameter`` objects, is freed
too, and a stray use fails on the shape instead of computing with stale weights). Tensors the
kept stage shares (weights tied across stages) are left alone.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import torch
from torch import nn

__all__ = ["release_other_stages"]


def _empty_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=t.dtype, device=t.device)


def release_other_stages(stages: Sequence[nn.Module], keep: int) -> int:
    """Empty the tensors of ``stages`` other than ``stages[keep]`` that ``stages[keep]`` does not
    share; returns the number of bytes released."""
    local = stages[keep]
    kept = {id(t) for t in itertools.chain(local.parameters(), local.buffers())}
    released = 0
    for k, stage in enumerate(stages):
        if k == keep:
            continue
        for mod in stage.modules():
            for p in mod._parameters.values():
                if p is not None and id(p) not in kept and p.numel():
                    released += p.numel() * p.element_size()
                    p.data = _empty_like(p)
                    p.grad = None
            for b in mod._buffers.values():
                if b is not None and id(b) not in kept and b.numel():
                    released += b.numel() * b.element_size()
                    b.data = _empty_like(b)
    return released

