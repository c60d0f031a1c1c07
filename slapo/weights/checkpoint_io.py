"""The older checkpoint format (``manifest.json`` + ``rank-*.pt``): read, no longer written.

New saves go through ``torch.distributed.checkpoint``: :func:`slapo.save_training_state`.
``slapo.save_checkpoint(model, dir)`` is kept as a deprecated wrapper that warns once and writes
the model's weights as such a DCP state; ``slapo.load_checkpoint(model, dir)`` reads either that
or a directory of the older format, and ``python -m slapo.weights.convert OLD NEW`` converts an
old directory once and for all.

The older format (:mod:`slapo.weights.checkpoint_format`; :func:`write_legacy_checkpoint`, kept
for the converter's and the reader's tests, writes it): one file per rank, each distinct piece
written once, and a ``manifest.json`` with each tensor's dtype, global shape, tied names and
pieces (global slice, file, sha256). Each rank reads only the pieces that overlap its part (by
its :class:`~slapo.sharding.ShardSpec`): TP=2 -> TP=1 -> TP=2 round trips are bit-exact, whatever
axis either side shards. Everything is validated first (manifest, names, dtypes, shapes,
coverage, file sizes, checksums) and the ranks agree before anything is copied, so a refused
checkpoint never leaves the model half-loaded. Works without ``torch.distributed``.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from .checkpoint_format import (
    FORMAT, MANIFEST, VERSION, ModelTensor, Piece, Region, digest, dtype_name, file_name,
    model_tensors, overlap, piece_tensor, regions_of,
)
from ..errors import CheckpointIOError

__all__ = ["save_checkpoint", "load_checkpoint", "write_legacy_checkpoint"]


def _model_of(target: Any, call: str) -> nn.Module:
    from ..schedule import Schedule

    model = target.mod if isinstance(target, Schedule) else target
    if not isinstance(model, nn.Module):
        raise CheckpointIOError(f"expected a model or a Schedule, got {type(target).__name__}",
                                call=call, hint="pass the built model (or its schedule)")
    return model


def _dist(group) -> Tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _gather(obj: Any, group, world: int) -> List[Any]:
    if world == 1:
        return [obj]
    out: List[Any] = [None] * world
    dist.all_gather_object(out, obj, group=group)
    return out


RETIRED = ("slapo.save_checkpoint is deprecated: it now writes the weights as a DCP training "
           "state; call slapo.save_training_state(directory, model, optimizer, step=...) "
           "instead (and python -m slapo.weights.convert OLD NEW for a directory of the older "
           "manifest.json format)")
_warned = False


def save_checkpoint(model: Any, directory: str, group: Optional[Any] = None) -> str:
    """Deprecated: write ``model``'s weights into ``directory`` as a DCP training state
    (:func:`slapo.save_training_state` with no optimizer, step 0), warning once per process.
    :func:`load_checkpoint` reads it back at any layout. Every rank must call it.

    Returns:
        ``directory``.

    Raises:
        CheckpointIOError: a ``group`` other than the default one (DCP saves over all ranks;
            call ``slapo.save_training_state``), a tensor still on the meta device.
    """
    global _warned
    from .training_state import save_training_state

    if not _warned:
        _warned = True
        warnings.warn(RETIRED, FutureWarning, stacklevel=2)
    if group is not None and dist.is_initialized() and (dist.get_world_size(group)
                                                        != dist.get_world_size()):
        raise CheckpointIOError("a process group other than the default one was given",
                                call="save_checkpoint", hint="save over all ranks with "
                                "slapo.save_training_state(directory, model)")
    save_training_state(directory, _model_of(model, "save_checkpoint"))
    return directory


def write_legacy_checkpoint(model: Any, directory: str, group: Optional[Any] = None) -> str:
    """Write this rank's shards of ``model`` and (on rank 0) the manifest into ``directory``,
    in the older format that :func:`load_checkpoint` and ``python -m slapo.weights.convert``
    still read (new code saves with :func:`slapo.save_training_state`).

    Every rank of ``group`` (default: all ranks) must call it. Parameters and persistent buffers
    are saved (like ``state_dict``); a piece held by several ranks (replicated tensors, data
    parallel replicas) is written once, by the lowest rank holding it.

    Returns:
        the path of ``manifest.json``.

    Raises:
        CheckpointIOError: a tensor is still on the meta device, or a shard spec contradicts its
            tensor's shape.
    """
    call = "write_legacy_checkpoint"
    model = _model_of(model, call)
    rank, world = _dist(group)
    tensors = model_tensors(model)
    mine: Dict[str, dict] = {}
    for mt in tensors:
        name = mt.names[0]
        if mt.tensor.is_meta:
            raise CheckpointIOError(f"'{name}' is still on the meta device", call=call,
                                    hint="build the model (slapo.build(sch, init_weights=...)) "
                                    "before saving it")
        spec = mt.spec
        if spec is not None and tuple(mt.tensor.shape) != spec.local_shape:
            raise CheckpointIOError(f"'{name}' has shape {tuple(mt.tensor.shape)} but its shard "
                                    f"spec says {spec.local_shape}", call=call,
                                    hint="shard tensors only with sch[...].shard(...)")
        mine[name] = {"names": mt.names, "kind": mt.kind, "dtype": dtype_name(mt.tensor.dtype),
                      "shape": list(mt.global_shape),
                      "regions": [(r.axis, r.start, r.length) for r in regions_of(spec)]}
    everyone = _gather(mine, group, world)
    _check_same_tensors(everyone, call)

    # The lowest rank holding a piece writes it.
    writer: Dict[Tuple[str, Optional[int], int, int], int] = {}
    for r, table in enumerate(everyone):
        for name, info in table.items():
            for region in info["regions"]:
                writer.setdefault((name, *region), r)
    fname = file_name(rank, world)
    pieces: Dict[str, torch.Tensor] = {}
    slices: Dict[str, dict] = {}
    entries: Dict[str, List[dict]] = {}
    for mt in tensors:
        name = mt.names[0]
        for region in regions_of(mt.spec):
            if writer[(name, region.axis, region.start, region.length)] != rank:
                continue
            key = f"{name}#{region.axis}:{region.start}"
            data = piece_tensor(mt.tensor, region)
            pieces[key] = data
            slices[key] = {"name": name, "axis": region.axis, "start": region.start,
                           "length": region.length, "global_shape": list(mt.global_shape)}
            entries.setdefault(name, []).append(
                Piece(fname, key, region.axis, region.start, region.length,
                      digest(data)).to_json())
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, fname)
    torch.save({"format": FORMAT, "rank": rank, "pieces": pieces, "slices": slices},
               path + ".tmp")
    os.replace(path + ".tmp", path)
    report = {"file": fname, "bytes": os.path.getsize(path), "pieces": entries}
    reports = _gather(report, group, world)
    manifest_path = os.path.join(directory, MANIFEST)
    if rank == 0:
        manifest = {"format": FORMAT, "version": VERSION, "world_size": world,
                    "files": {rep["file"]: {"bytes": rep["bytes"]} for rep in reports},
                    "tensors": {}}
        for name, info in everyone[0].items():
            found = [p for rep in reports for p in rep["pieces"].get(name, [])]
            manifest["tensors"][name] = {
                "kind": info["kind"], "dtype": info["dtype"], "shape": info["shape"],
                "aliases": info["names"][1:],
                "pieces": sorted(found, key=lambda p: (p["axis"] is not None, p["start"]))}
        with open(manifest_path + ".tmp", "w") as f:
            json.dump(manifest, f, indent=1)
        os.replace(manifest_path + ".tmp", manifest_path)
    if world > 1:
        dist.barrier(group=group)
    return manifest_path


def _check_same_tensors(everyone: List[Dict[str, dict]], call: str) -> None:
    ref = everyone[0]
    for r, table in enumerate(everyone[1:], start=1):
        for name in sorted(set(ref) ^ set(table)):
            raise CheckpointIOError(f"rank {r} and rank 0 disagree about tensor '{name}'",
                                    call=call, hint="every rank must save the same model")
        for name, info in table.items():
            if (info["dtype"], info["shape"]) != (ref[name]["dtype"], ref[name]["shape"]):
                raise CheckpointIOError(f"'{name}' is {info['dtype']}{info['shape']} on rank {r} "
                                        f"but {ref[name]['dtype']}{ref[name]['shape']} on rank 0",
                                        call=call, hint="every rank must save the same model")


# ------------------------------------------------------------------------------- loading
def load_checkpoint(model: Any, directory: str, group: Optional[Any] = None) -> nn.Module:
    """Load the weights saved by :func:`save_checkpoint` (a DCP state: read by
    :func:`slapo.load_training_state`) or a directory of the older format (``manifest.json``)
    into ``model``, resharding as needed.

    ``model`` may be sharded differently from the saver (another TP degree or axis); each rank
    copies the overlap of its part with every stored piece. Every rank of ``group`` must call it.

    Returns:
        ``model``, with every parameter and persistent buffer overwritten in place.

    Raises:
        CheckpointIOError: (on every rank, before anything is loaded) no or an unreadable
            manifest, another format version, parameter names missing from or extra in the
            checkpoint, a dtype or global shape that differs, pieces that overlap or leave a
            gap, a missing or truncated file, or a checksum mismatch.
    """
    call = "load_checkpoint"
    model = _model_of(model, call)
    if not os.path.isfile(os.path.join(directory, MANIFEST)) and os.path.isfile(
            os.path.join(directory, ".metadata")):
        from .training_state import load_training_state

        load_training_state(directory, model)
        return model
    rank, world = _dist(group)
    try:
        copies = _plan_load(model, directory, call)
        error = None
    except Exception as exc:  # noqa: BLE001 - the other ranks must learn of any failure
        copies, error = [], exc
    errors = _gather(None if error is None else str(error), group, world)
    if error is not None:
        raise error
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        r, msg = failed[0]
        raise CheckpointIOError(f"rank {r} refused the checkpoint, so nothing was loaded: {msg}",
                                call=call, hint="fix the checkpoint as that rank's error says")
    with torch.no_grad():
        for dst, dst_idx, src, src_idx in copies:
            dst[dst_idx].copy_(src[src_idx])
    return model


Copy = Tuple[torch.Tensor, Tuple[slice, ...], torch.Tensor, Tuple[slice, ...]]


def _plan_load(model: nn.Module, directory: str, call: str) -> List[Copy]:
    """Validate everything this rank needs and return the copies to make (touching nothing)."""
    manifest = _read_manifest(directory, call)
    entries: Dict[str, dict] = manifest["tensors"]
    alias_of = {a: name for name, e in entries.items() for a in [name, *e.get("aliases", [])]}
    tensors = model_tensors(model)
    model_names = {n for mt in tensors for n in mt.names}
    missing = sorted(model_names - set(alias_of))
    extra = sorted(set(alias_of) - model_names)
    if missing or extra:
        what = "; ".join(s for s in (
            f"missing from the checkpoint: {_names(missing)}" if missing else "",
            f"in the checkpoint but not in the model: {_names(extra)}" if extra else "") if s)
        raise CheckpointIOError(f"the checkpoint does not match the model ({what})", call=call,
                                hint="load into the same model architecture that was saved")
    needed: Dict[str, List[Tuple[ModelTensor, Region, Piece]]] = {}
    for mt in tensors:
        name = mt.names[0]
        stored = {alias_of[n] for n in mt.names}
        if len(stored) > 1:
            raise CheckpointIOError(f"the model ties {_names(mt.names)} but the checkpoint "
                                    f"stores {_names(sorted(stored))} separately", call=call,
                                    hint="tie (or untie) the weights as in the saved model")
        entry = entries[stored.pop()]
        if mt.tensor.is_meta:
            raise CheckpointIOError(f"'{name}' is on the meta device", call=call,
                                    hint="build the model (slapo.build) before loading into it")
        if entry["dtype"] != dtype_name(mt.tensor.dtype):
            raise CheckpointIOError(f"'{name}' is {dtype_name(mt.tensor.dtype)} in the model but "
                                    f"{entry['dtype']} in the checkpoint", call=call,
                                    hint="convert the model to the saved dtype before loading")
        shape = mt.global_shape
        if tuple(entry["shape"]) != shape:
            raise CheckpointIOError(f"'{name}' has global shape {list(shape)} in the model but "
                                    f"{entry['shape']} in the checkpoint", call=call,
                                    hint="use the same model configuration (e.g. vocab padding)")
        pieces = _check_pieces(name, entry, manifest, call)
        for region in regions_of(mt.spec):
            covered = 0
            for piece in pieces:
                hit = overlap(region, piece.region(), shape)
                if hit is not None:
                    covered += hit[2]
                    needed.setdefault(piece.file, []).append((mt, region, piece))
            want = _numel(region.box(shape))
            assert covered == want, (name, covered, want)  # pieces were checked to tile
    return _read_pieces(directory, manifest, needed, call)


def _read_manifest(directory: str, call: str) -> dict:
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise CheckpointIOError(f"no {MANIFEST} in '{directory}'", call=call,
                                hint="pass a directory written by slapo.save_training_state "
                                "(or an older save_checkpoint directory)")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as exc:
        raise CheckpointIOError(f"{path} is unreadable or corrupt ({exc})", call=call,
                                hint="the checkpoint is damaged; save it again") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointIOError(f"{path} is not a slapo checkpoint manifest", call=call,
                                hint="pass a directory written by slapo.save_training_state "
                                "(or an older save_checkpoint directory)")
    if manifest.get("version") != VERSION:
        raise CheckpointIOError(f"checkpoint format version {manifest.get('version')} is not "
                                f"supported (this slapo reads version {VERSION})", call=call,
                                hint="load it with the slapo version that wrote it")
    if not isinstance(manifest.get("tensors"), dict) or not isinstance(manifest.get("files"),
                                                                       dict):
        raise CheckpointIOError(f"{path} lacks its tensor or file table", call=call,
                                hint="the checkpoint is damaged; save it again")
    return manifest


def _check_pieces(name: str, entry: dict, manifest: dict, call: str) -> List[Piece]:
    """The pieces of one tensor must lie inside it, not overlap, and cover it exactly."""
    shape = tuple(entry["shape"])
    try:
        pieces = [Piece(**p) for p in entry["pieces"]]
    except TypeError as exc:
        raise CheckpointIOError(f"the manifest entry of '{name}' is malformed ({exc})",
                                call=call, hint="the checkpoint is damaged; save it again"
                                ) from exc
    total = 0
    for i, p in enumerate(pieces):
        inside = p.axis is None or (0 <= p.axis < len(shape) and 0 <= p.start
                                    and p.length > 0 and p.start + p.length <= shape[p.axis])
        if not inside or p.file not in manifest["files"]:
            raise CheckpointIOError(f"piece {p.key} of '{name}' lies outside the tensor or in an "
                                    "unknown file", call=call,
                                    hint="the checkpoint is damaged; save it again")
        for q in pieces[:i]:
            if overlap(p.region(), q.region(), shape) is not None:
                raise CheckpointIOError(f"pieces {q.key} and {p.key} of '{name}' overlap",
                                        call=call, hint="the checkpoint is damaged; save it again")
        total += _numel(p.region().box(shape))
    if total != _numel([(0, n) for n in shape]):
        raise CheckpointIOError(f"the pieces of '{name}' do not cover the whole tensor "
                                f"({total} of {_numel([(0, n) for n in shape])} elements)",
                                call=call, hint="the checkpoint is incomplete; save it again")
    return pieces


def _read_pieces(directory: str, manifest: dict, needed: Dict[str, list], call: str
                 ) -> List[Copy]:
    copies: List[Copy] = []
    for fname, uses in needed.items():
        path = os.path.join(directory, fname)
        expected = manifest["files"][fname].get("bytes")
        size = os.path.getsize(path) if os.path.isfile(path) else None
        if size is None:
            raise CheckpointIOError(f"{path} is missing", call=call,
                                    hint="copy every rank-*.pt file of the checkpoint")
        if size != expected:
            raise CheckpointIOError(f"{path} has {size} bytes but the manifest says {expected} "
                                    "(truncated or replaced)", call=call,
                                    hint="the checkpoint is damaged; save it again")
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            stored = payload["pieces"]
        except Exception as exc:
            raise CheckpointIOError(f"{path} cannot be read ({type(exc).__name__}: {exc})",
                                    call=call, hint="the checkpoint is damaged; save it "
                                    "again") from exc
        verified: set = set()
        for mt, region, piece in uses:
            data = stored.get(piece.key) if isinstance(stored, dict) else None
            shape = list(mt.global_shape)
            if piece.axis is not None:
                shape[piece.axis] = piece.length
            if not isinstance(data, torch.Tensor) or list(data.shape) != shape \
                    or data.dtype != mt.tensor.dtype:
                raise CheckpointIOError(f"{path} lacks piece {piece.key} of shape {shape}",
                                        call=call, hint="the checkpoint is damaged; save it again")
            if piece.key not in verified:
                if digest(data) != piece.sha256:
                    raise CheckpointIOError(f"checksum mismatch for piece {piece.key} in {path}",
                                            call=call,
                                            hint="the checkpoint is corrupt; save it again")
                verified.add(piece.key)
            dst_idx, src_idx, _ = overlap(region, piece.region(), mt.global_shape)
            copies.append((mt.tensor.data, dst_idx, data, src_idx))
    return copies


def _numel(box) -> int:
    n = 1
    for lo, hi in box:
        n *= hi - lo
    return n


def _names(names: List[str], limit: int = 5) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
