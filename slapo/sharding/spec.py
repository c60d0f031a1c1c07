"""How a tensor is split across tensor-parallel ranks.

Every sharded parameter or buffer carries a :class:`ShardSpec` as the attribute
``slapo_shard`` (registered as a parameter tag, so it survives re-creation of the parameter).
It is the single source of truth for delayed initialisation (which slice of the full tensor this
rank materialises), checkpoint saving/loading with resharding, and verification (gathering
shards back into the full tensor).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Tuple

import torch

__all__ = ["ShardSpec", "SHARD_ATTR", "get_shard_spec", "set_shard_spec"]

SHARD_ATTR = "slapo_shard"


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """This rank holds chunk ``rank`` of ``world_size`` equal chunks along ``axis`` of a tensor
    whose full shape is ``global_shape``.

    ``parts > 1`` describes a *fused* axis (e.g. GPT-2's ``c_attn`` whose output axis is the
    concatenation ``[q | k | v]``): the axis is ``parts`` equal blocks, each block is split into
    ``world_size`` chunks, and this rank holds chunk ``rank`` of every block, concatenated
    (``[q_r | k_r | v_r]``), so each rank gets whole heads of q, k and v. Such a shard is not one
    contiguous slice: use :meth:`slice_of` and :meth:`join`, not :meth:`index`.
    """

    axis: int
    world_size: int
    rank: int
    global_shape: Tuple[int, ...]
    parts: int = 1

    def __post_init__(self):
        size = self.global_shape[self.axis]
        assert size % (self.world_size * self.parts) == 0, (self, "indivisible shard")
        assert 0 <= self.rank < self.world_size, self

    @property
    def local_shape(self) -> Tuple[int, ...]:
        shape = list(self.global_shape)
        shape[self.axis] //= self.world_size
        return tuple(shape)

    @property
    def start(self) -> int:
        """Offset of this rank's chunk along ``axis`` in the full tensor."""
        return self.rank * (self.global_shape[self.axis] // self.world_size)

    def index(self) -> Tuple[slice, ...]:
        """Index of this rank's chunk in the full tensor (``full[spec.index()]``); only for
        ``parts == 1`` (a fused shard is not one slice)."""
        assert self.parts == 1, (self, "a fused shard has no single index; use slice_of/join")
        idx = [slice(None)] * len(self.global_shape)
        length = self.global_shape[self.axis] // self.world_size
        idx[self.axis] = slice(self.start, self.start + length)
        return tuple(idx)

    def slice_of(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of ``full``: a contiguous copy of its own (a view of an axis-0 chunk
        would keep the whole tensor's storage alive on every rank); works on meta tensors."""
        assert tuple(full.shape) == tuple(self.global_shape), (full.shape, self)
        if self.parts == 1:
            return full[self.index()].clone(memory_format=torch.contiguous_format)
        blocks = full.chunk(self.parts, dim=self.axis)
        mine = [b.chunk(self.world_size, dim=self.axis)[self.rank] for b in blocks]
        return torch.cat(mine, dim=self.axis).contiguous()

    def join(self, chunks: Sequence[torch.Tensor]) -> torch.Tensor:
        """The full tensor from every rank's chunk (in rank order); inverse of :meth:`slice_of`."""
        assert len(chunks) == self.world_size, (len(chunks), self)
        if self.parts == 1:
            return torch.cat(list(chunks), dim=self.axis)
        per_rank = [c.chunk(self.parts, dim=self.axis) for c in chunks]
        blocks = [torch.cat([p[i] for p in per_rank], dim=self.axis) for i in range(self.parts)]
        return torch.cat(blocks, dim=self.axis)


def get_shard_spec(t: torch.Tensor) -> Optional[ShardSpec]:
    """The spec of a sharded tensor, or ``None`` if it is replicated."""
    return getattr(t, SHARD_ATTR, None)


def set_shard_spec(t: torch.Tensor, spec: ShardSpec) -> None:
    """Attach ``spec`` to ``t``."""
    setattr(t, SHARD_ATTR, spec)
