"""Vocab-parallel embedding: each rank holds rows ``[start, start + size)`` of the table.

Sharding an ``nn.Embedding`` weight on axis 0 installs :class:`VocabParallelLookup` as a forward
wrapper (the module keeps its class, path and state-dict keys). It maps ids to local rows, looks
up ids outside this rank's range as local row 0 and zeroes those output rows, so the module's
output is a *partial* sum: ``sync('fwd_post', 'all_reduce')`` (or ``'reduce_scatter'`` along the
sequence axis) completes it. Every id in ``[start, start + size)``, including ``start`` itself,
is looked up (the reference zeroed the shard-start id as well -- not copied here).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

from ..runtime.forward_wrap import has_forward_wrapper, install_forward_wrapper

__all__ = ["VocabParallelLookup", "make_vocab_parallel", "VOCAB_PARALLEL"]

VOCAB_PARALLEL = "vocab_parallel"


class VocabParallelLookup:
    """Forward wrapper of a vocab-sharded embedding holding global rows ``[start, start+size)``."""

    def __init__(self, start: int, size: int):
        self.start, self.size = start, size

    def __call__(self, inner: Callable, input: torch.Tensor, *args: Any, **kwargs: Any):
        local = input - self.start
        outside = (local < 0) | (local >= self.size)
        out = inner(local.masked_fill(outside, 0), *args, **kwargs)
        return out.masked_fill(outside.unsqueeze(-1), 0.0)

    def __repr__(self) -> str:
        return f"VocabParallelLookup(rows {self.start}..{self.start + self.size - 1})"


def _local_padding_idx(padding_idx: Optional[int], start: int, size: int) -> Optional[int]:
    if padding_idx is None or not start <= padding_idx < start + size:
        return None
    return padding_idx - start


def make_vocab_parallel(mod: nn.Embedding, start: int, size: int) -> None:
    """Make ``mod`` (whose weight is already this rank's row chunk) look up global ids."""
    if has_forward_wrapper(mod, VOCAB_PARALLEL):
        return
    mod.slapo_global_padding_idx = mod.padding_idx  # type: ignore[attr-defined]
    mod.padding_idx = _local_padding_idx(mod.padding_idx, start, size)
    install_forward_wrapper(mod, VOCAB_PARALLEL, VocabParallelLookup(start, size))
