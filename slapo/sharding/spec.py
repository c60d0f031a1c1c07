"""How a tensor is split across tensor-parallel ranks.

Every sharded parameter or buffer carries a :class:`ShardSpec` as the attribute
``slapo_shard`` (registered as a parameter tag, so it survives re-creation of the parameter).
It is the single source of truth for delayed initialisation (which slice of the full tensor this
rank materialises), checkpoint saving/loading with resharding, and verification (gathering
shards back into the full tensor).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

__all__ = ["ShardSpec", "SHARD_ATTR", "get_shard_spec", "set_shard_spec"]

SHARD_ATTR = "slapo_shard"


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """This rank holds chunk ``rank`` of ``world_size`` equal chunks along ``axis`` of a tensor
    whose full shape is ``global_shape``."""

    axis: int
    world_size: int
    rank: int
    global_shape: Tuple[int, ...]

    def __post_init__(self):
        size = self.global_shape[self.axis]
        assert size % self.world_size == 0, (self, "indivisible shard")  # checked by shard()
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
        """Index of this rank's chunk in the full tensor (``full[spec.index()]``)."""
        idx = [slice(None)] * len(self.global_shape)
        length = self.global_shape[self.axis] // self.world_size
        idx[self.axis] = slice(self.start, self.start + length)
        return tuple(idx)

    def slice_of(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of ``full`` (a contiguous copy)."""
        assert tuple(full.shape) == tuple(self.global_shape), (full.shape, self)
        return full[self.index()].contiguous()


def get_shard_spec(t: torch.Tensor) -> Optional[ShardSpec]:
    """The spec of a sharded tensor, or ``None`` if it is replicated."""
    return getattr(t, SHARD_ATTR, None)


def set_shard_spec(t: torch.Tensor, spec: ShardSpec) -> None:
    """Attach ``spec`` to ``t``."""
    setattr(t, SHARD_ATTR, spec)
