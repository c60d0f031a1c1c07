"""Rank layout of a tensor x data x pipeline parallel world: the one place for its arithmetic.

Ranks are numbered with the tensor-parallel rank fastest, then the data-parallel replica, then the
pipeline stage (the order of Megatron-LM and of DeepSpeed's ``PipeModelDataParallelTopology``)::

    rank = (stage * dp + replica) * tp + tp_rank

So a tensor-parallel group is a block of ``tp`` consecutive ranks, a pipeline (one replica of the
model) is the ranks with equal ``(replica, tp_rank)``, and a data-parallel group is the ranks with
equal ``(stage, tp_rank)``. Example: 8 ranks, ``tp=2, pp=2`` (so ``dp=2``):
TP groups ``[0,1] [2,3] [4,5] [6,7]``; pipelines ``[0,4] [1,5] [2,6] [3,7]``; DP groups
``[0,2] [1,3] [4,6] [5,7]``.

:class:`ParallelLayout` is pure arithmetic (no ``torch.distributed``); :func:`create_groups`
creates this rank's process groups from it.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch.distributed as dist

from ..runtime.distributed import default_timeout
from ..errors import BuildError

__all__ = ["Coords", "ParallelLayout", "LayoutGroups", "create_groups"]


class Coords(NamedTuple):
    """Where a rank sits in the layout."""

    stage: int
    replica: int
    tp_rank: int


@dataclasses.dataclass(frozen=True)
class ParallelLayout:
    """A world of ``tp * dp * pp`` ranks (see the module docstring for the numbering)."""

    tp: int
    dp: int
    pp: int

    @classmethod
    def for_world(cls, world_size: int, tp: int, pp: int) -> "ParallelLayout":
        """The layout with ``tp`` tensor-parallel ranks and ``pp`` stages over ``world_size``
        ranks; the rest is data parallelism.

        Raises:
            BuildError: a size is not positive, or ``tp * pp`` does not divide the world size.
        """
        if tp < 1 or pp < 1 or world_size < 1:
            raise BuildError(f"invalid parallel sizes world={world_size}, tp={tp}, pp={pp}",
                             call="build", hint="all sizes must be positive")
        if world_size % (tp * pp):
            raise BuildError(
                f"{pp} pipeline stage(s) x tensor-parallel size {tp} = {tp * pp} ranks per model "
                f"replica does not divide the world size {world_size}", call="build",
                hint=f"launch a multiple of {tp * pp} ranks (e.g. torchrun --nproc_per_node "
                     f"{tp * pp}), or change the number of cut_pipeline_stage() calls so that "
                     f"stages x tensor-parallel size divides {world_size}")
        return cls(tp=tp, dp=world_size // (tp * pp), pp=pp)

    @property
    def world_size(self) -> int:
        return self.tp * self.dp * self.pp

    def rank(self, stage: int, replica: int, tp_rank: int) -> int:
        """The global rank at these coordinates."""
        return (stage * self.dp + replica) * self.tp + tp_rank

    def coords(self, rank: int) -> Coords:
        """The coordinates of global ``rank``."""
        if not 0 <= rank < self.world_size:
            raise BuildError(f"rank {rank} is outside a world of {self.world_size}",
                             call="build", hint="check WORLD_SIZE / the launcher")
        tp_rank = rank % self.tp
        replica = (rank // self.tp) % self.dp
        return Coords(rank // (self.tp * self.dp), replica, tp_rank)

    # all groups of each kind, in a fixed order (every rank creates them in this order)
    def tp_groups(self) -> List[List[int]]:
        return [[self.rank(s, d, t) for t in range(self.tp)]
                for s in range(self.pp) for d in range(self.dp)]

    def pp_groups(self) -> List[List[int]]:
        return [[self.rank(s, d, t) for s in range(self.pp)]
                for d in range(self.dp) for t in range(self.tp)]

    def dp_groups(self) -> List[List[int]]:
        return [[self.rank(s, d, t) for d in range(self.dp)]
                for s in range(self.pp) for t in range(self.tp)]

    def stage_groups(self, stages: Sequence[int]) -> List[List[int]]:
        """For each pipeline (replica, tp_rank): the ranks running ``stages`` (e.g. the stages
        that share a tied parameter)."""
        ordered = sorted(set(stages))
        return [[self.rank(s, d, t) for s in ordered]
                for d in range(self.dp) for t in range(self.tp)]

    def group_of(self, groups: List[List[int]], rank: int) -> List[int]:
        """The member of ``groups`` that contains ``rank``."""
        for g in groups:
            if rank in g:
                return g
        raise BuildError(f"rank {rank} is in none of {groups}", call="build",
                         hint="internal layout error")


_GROUPS: Dict[Tuple[int, ...], dist.ProcessGroup] = {}


def _new_group(ranks: List[int]) -> Optional[dist.ProcessGroup]:
    """``dist.new_group(ranks)``, reused per rank list; the world itself is WORLD. Collective:
    every rank must call it with the same lists in the same order."""
    if len(ranks) == dist.get_world_size() and ranks == sorted(ranks):
        return dist.group.WORLD
    key = tuple(ranks)
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(ranks), timeout=default_timeout())
    return _GROUPS[key]


def _reset_groups() -> None:
    _GROUPS.clear()


@dataclasses.dataclass
class LayoutGroups:
    """This rank's pipeline and data-parallel process groups (the tensor-parallel group is the
    schedule's), with the layout they come from."""

    layout: ParallelLayout
    rank: int
    pp_group: Optional[dist.ProcessGroup]
    dp_group: Optional[dist.ProcessGroup]

    @property
    def coords(self) -> Coords:
        return self.layout.coords(self.rank)

    @property
    def pp_ranks(self) -> List[int]:
        return self.layout.group_of(self.layout.pp_groups(), self.rank)

    @property
    def dp_ranks(self) -> List[int]:
        return self.layout.group_of(self.layout.dp_groups(), self.rank)

    def tie_group(self, stages: Sequence[int]) -> Optional[dist.ProcessGroup]:
        """The group joining this pipeline's ranks of ``stages``. Collective over the world (all
        pipelines' groups for ``stages`` are created, in the same order on every rank)."""
        mine = None
        for ranks in self.layout.stage_groups(stages):
            group = _new_group(ranks)
            if self.rank in ranks:
                mine = group
        return mine


def create_groups(layout: ParallelLayout) -> LayoutGroups:
    """Create (or reuse) the pipeline and data-parallel groups of ``layout`` and return this
    rank's. Collective over the world.

    Raises:
        BuildError: the world size differs from the layout's.
    """
    if dist.get_world_size() != layout.world_size:
        raise BuildError(f"the layout {layout} needs {layout.world_size} ranks, the world has "
                         f"{dist.get_world_size()}", call="build",
                         hint="build the layout with ParallelLayout.for_world(world_size, ...)")
    rank = dist.get_rank()
    found: Dict[str, Optional[dist.ProcessGroup]] = {}
    for kind, groups in (("pp", layout.pp_groups()), ("dp", layout.dp_groups())):
        for ranks in groups:
            group = _new_group(ranks)
            if rank in ranks:
                found[kind] = group
    return LayoutGroups(layout, rank, found["pp"], found["dp"])
