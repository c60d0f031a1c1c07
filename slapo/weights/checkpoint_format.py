"""The on-disk format of sharded checkpoints, and the geometry of pieces.

A checkpoint is a directory::

    manifest.json                 format, version, world size, files, and per tensor: kind,
                                  dtype, global shape, aliases (tied names) and its pieces
    rank-00000-of-00002.pt        torch.save of {"format", "rank", "pieces": {key: tensor},
    rank-00001-of-00002.pt         "slices": {key: {name, axis, start, length, global_shape}}}

A *piece* is a block of a tensor's full (global) value: the whole tensor, or ``length`` entries
from ``start`` along ``axis``. Each distinct piece is stored once (by the lowest rank holding
it) with its sha256. A rank's own part of a tensor is a list of *regions* (a fused
:class:`~slapo.sharding.ShardSpec` holds several blocks); loading copies the overlap of every
region with every piece, so any TP degree and any shard axis can read any checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..sharding.spec import ShardSpec, get_shard_spec

__all__ = [
    "FORMAT", "VERSION", "MANIFEST", "Region", "Piece", "ModelTensor", "model_tensors",
    "regions_of", "overlap", "digest", "dtype_name", "file_name", "piece_tensor",
]

FORMAT = "slapo-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"

Box = List[Tuple[int, int]]  # [lo, hi) per dimension


@dataclasses.dataclass(frozen=True)
class Region:
    """``length`` entries from global ``start`` along ``axis`` (``axis is None``: the whole
    tensor), stored from ``local_start`` along the same axis of this rank's tensor."""

    axis: Optional[int]
    start: int
    length: int
    local_start: int = 0

    def box(self, shape: Sequence[int]) -> Box:
        out = [(0, int(n)) for n in shape]
        if self.axis is not None:
            out[self.axis] = (self.start, self.start + self.length)
        return out


@dataclasses.dataclass
class Piece:
    """One stored block of a tensor (an entry of the manifest)."""

    file: str
    key: str
    axis: Optional[int]
    start: int
    length: int
    sha256: str

    def region(self) -> Region:
        return Region(self.axis, self.start, self.length)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ModelTensor:
    """A tensor of the model as a checkpoint sees it (tied names grouped)."""

    names: List[str]  # first is canonical
    tensor: torch.Tensor
    kind: str  # "param" | "buffer"

    @property
    def spec(self) -> Optional[ShardSpec]:
        return get_shard_spec(self.tensor)

    @property
    def global_shape(self) -> Tuple[int, ...]:
        spec = self.spec
        return tuple(spec.global_shape) if spec is not None else tuple(self.tensor.shape)


def model_tensors(model: nn.Module) -> List[ModelTensor]:
    """Parameters and persistent buffers (what ``state_dict`` holds), tied names grouped."""
    out: Dict[int, ModelTensor] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out.setdefault(id(p), ModelTensor([], p, "param")).names.append(name)
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for attr, b in mod._buffers.items():
            if b is None or attr in mod._non_persistent_buffers_set:
                continue
            name = f"{mod_name}.{attr}" if mod_name else attr
            entry = out.setdefault(id(b), ModelTensor([], b, "buffer"))
            if name not in entry.names:
                entry.names.append(name)
    return list(out.values())


def regions_of(spec: Optional[ShardSpec]) -> List[Region]:
    """This rank's part of a tensor as regions of the full tensor (several for fused shards)."""
    if spec is None:
        return [Region(None, 0, 0)]
    size = spec.global_shape[spec.axis]
    parts = getattr(spec, "parts", 1)
    block, chunk = size // parts, size // (parts * spec.world_size)
    return [Region(spec.axis, b * block + spec.rank * chunk, chunk, b * chunk)
            for b in range(parts)]


def overlap(region: Region, piece: Region, shape: Sequence[int]
            ) -> Optional[Tuple[Tuple[slice, ...], Tuple[slice, ...], int]]:
    """Where ``piece`` overlaps ``region`` of a tensor of global ``shape``: the index into this
    rank's local tensor, the index into the stored piece, and the number of elements; ``None``
    if they do not overlap."""
    rbox, pbox = region.box(shape), piece.box(shape)
    dst, src, numel = [], [], 1
    for d, ((rlo, rhi), (plo, phi)) in enumerate(zip(rbox, pbox)):
        lo, hi = max(rlo, plo), min(rhi, phi)
        if lo >= hi:
            return None
        numel *= hi - lo
        shift = region.local_start if region.axis == d else 0
        dst.append(slice(lo - rlo + shift, hi - rlo + shift))
        src.append(slice(lo - plo, hi - plo))
    return tuple(dst), tuple(src), numel


def digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (shape and dtype are checked separately)."""
    data = t.detach().cpu().contiguous().reshape(-1)
    if data.numel() == 0:
        return hashlib.sha256(b"").hexdigest()
    return hashlib.sha256(data.view(torch.uint8).numpy()).hexdigest()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def file_name(rank: int, world_size: int) -> str:
    return f"rank-{rank:05d}-of-{world_size:05d}.pt"


def piece_tensor(t: torch.Tensor, region: Region) -> torch.Tensor:
    """A compact CPU copy of ``region`` of this rank's tensor ``t`` (for saving)."""
    data = t.detach()
    if region.axis is not None:
        data = data.narrow(region.axis, region.local_start, region.length)
    return data.to("cpu", copy=True).contiguous()
