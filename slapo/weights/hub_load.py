"""``slapo.load_pretrained``: fill a scheduled model, at any sharding, from HuggingFace weights.

The model may be on the meta device (built under :func:`slapo.init_empty_weights` and
scheduled: sharded tensors carry their :class:`~slapo.sharding.ShardSpec`); each rank then
allocates only its shards and reads only the slices of the stored tensors they cover
(``safe_open(...).get_slice``), so no rank holds a full copy of the model. Everything is checked
before anything is allocated or copied (files, names, shapes, dtypes, coverage, and on several
ranks that every stored tensor is used by some rank); the ranks agree on the outcome, so a
refused checkpoint leaves every rank's model unchanged. See :mod:`slapo.weights.hub_plan` for
how model tensors are matched to stored ones.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn

from ..errors import CheckpointIOError
from .checkpoint_format import regions_of
from .hub_files import StoredTensor, read_hub_directory
from .hub_plan import DerivedGroup, DirectPlan, HubPlan, plan_hub_load, positions

__all__ = ["load_pretrained", "last_read_bytes"]

CALL = "load_pretrained"
_STATS = {"read_bytes": 0}


def last_read_bytes() -> int:
    """Bytes of stored tensors this process read in its last :func:`load_pretrained` (what a
    rank reads is about its shards' size: the memory benchmark and the tests check it)."""
    return _STATS["read_bytes"]


def _target(target: Any) -> Tuple[nn.Module, str]:
    from ..schedule import Schedule

    if isinstance(target, Schedule):
        return target.mod, target.path
    if isinstance(target, nn.Module):
        return target, ""
    raise CheckpointIOError(f"expected a model or a Schedule, got {type(target).__name__}",
                            call=CALL, hint="pass the schedule (or the model) to fill")


def _dist(group) -> Tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _check_dtypes(plan: HubPlan) -> None:
    pairs = [(d.mt, b.src) for d in plan.direct for b in d.blocks]
    pairs += [(mt, st) for g in plan.derived for st in g.originals for mt in g.params[:1]]
    for mt, st in pairs:
        a, b = mt.tensor.dtype, st.dtype
        if a.is_floating_point != b.is_floating_point or (a == torch.bool) != (b == torch.bool):
            raise CheckpointIOError(
                f"'{st.key}' is stored as {str(b)[6:]} but the model's '{mt.names[0]}' is "
                f"{str(a)[6:]} (mismatched dtype)", call=CALL,
                hint="floating tensors convert to the model's dtype, but not to or from "
                "integers or booleans: check that the checkpoint belongs to this model")


def load_pretrained(target: Any, path: str, *, group: Optional[Any] = None,
                    device: Union[None, str, torch.device] = None,
                    strict: bool = True) -> nn.Module:
    """Fill ``target`` (a ``Schedule`` or a model, possibly on the meta device) from the
    HuggingFace safetensors checkpoint in directory ``path``, as ``from_pretrained`` would, at
    whatever tensor / expert / pipeline parallel layout the schedule gave it.

    Every rank of ``group`` (default: all ranks) must call it. Each rank reads only the slices
    of the stored tensors its own shards cover: a q|k|v or gate|up packed shard reads its block
    of each part, an expert-parallel rank its experts, a vocab-parallel embedding its rows (a
    padded vocabulary gets zero rows), a pipeline stage its own layers; tied weights are read
    once. Stored floating tensors are converted to the model's dtypes.

    Args:
        target: the schedule (load before ``slapo.build``: meta tensors are allocated here, on
            ``device``, default CPU) or a built model (filled in place).
        path: a directory as ``save_pretrained`` / :func:`slapo.export_pretrained` write it
            (``model.safetensors``, or shards and ``model.safetensors.index.json``).
        strict: refuse stored tensors that no rank uses (the model's
            ``_keys_to_ignore_on_load_unexpected`` patterns excepted).

    Returns:
        the model, every parameter and persistent buffer loaded.

    Raises:
        CheckpointIOError: on every rank, before anything changes: a missing directory, index,
            shard or tensor; a truncated or malformed file; a shape that differs; a dtype that
            cannot convert; stored tensors no rank uses (``strict``).
    """
    model, prefix = _target(target)
    rank, world = _dist(group)
    plan: Optional[HubPlan] = None
    stored: Dict[str, StoredTensor] = {}
    try:
        stored = read_hub_directory(path)
        plan = plan_hub_load(model, stored, prefix)
        _check_dtypes(plan)
        error: Optional[BaseException] = None
    except CheckpointIOError as exc:
        error = exc
    mine = (None if error is None else str(error), sorted(set(plan.used)) if plan else [])
    everyone = _gather(mine, group, world)
    if error is not None:
        raise error
    failed = [(r, e) for r, (e, _) in enumerate(everyone) if e is not None]
    if failed:
        r, msg = failed[0]
        raise CheckpointIOError(f"rank {r} refused the checkpoint, so nothing was loaded: {msg}",
                                call=CALL, hint="fix the checkpoint as that rank's error says")
    assert plan is not None
    if strict:
        _check_unused(model, stored, {k for _, used in everyone for k in used}, path)
    made = _allocate(model, device)
    for mt in [d.mt for d in plan.direct] + [mt for g in plan.derived for mt in g.params]:
        mt.tensor = made.get(id(mt.tensor), mt.tensor)
    with torch.no_grad(), _Reader() as reader:
        for d in plan.direct:
            _copy_direct(d, reader)
        for g in plan.derived:
            _copy_derived(g, reader)
    _STATS["read_bytes"] = reader.bytes
    return model


def _gather(obj: Any, group, world: int) -> List[Any]:
    if world == 1:
        return [obj]
    out: List[Any] = [None] * world
    dist.all_gather_object(out, obj, group=group)
    return out


def _check_unused(model: nn.Module, stored: Dict[str, StoredTensor], used: set,
                  path: str) -> None:
    ignore = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected",
                                             None) or []]
    unused = sorted(k for k in set(stored) - used if not any(p.search(k) for p in ignore))
    if unused:
        shown = ", ".join(f"'{k}'" for k in unused[:4]) + (" ..." if len(unused) > 4 else "")
        raise CheckpointIOError(
            f"{len(unused)} tensor(s) of '{path}' fit no tensor of the model: {shown}",
            call=CALL, hint="load it into the model class it was saved from (or pass "
            "strict=False to leave them out)")


def _allocate(model: nn.Module, device: Union[None, str, torch.device]
              ) -> Dict[int, torch.Tensor]:
    """Replace every meta parameter / buffer by an empty tensor of its local shape (ties and
    shard specs kept)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    made: Dict[int, torch.Tensor] = {}
    for mod in model.modules():
        for table in (mod._parameters, mod._buffers):
            for name, t in list(table.items()):
                if t is None or not t.is_meta:
                    continue
                new = made.get(id(t))
                if new is None:
                    data = torch.empty(t.shape, dtype=t.dtype, device=dev)
                    new = (nn.Parameter(data, requires_grad=t.requires_grad)
                           if isinstance(t, nn.Parameter) else data)
                    new.__dict__.update(t.__dict__)  # shard spec and annotations
                    made[id(t)] = new
                table[name] = new  # type: ignore[assignment]
    return made


class _Reader:
    """Reads slices of stored tensors. Each read maps the file only while it reads: pages of
    a file kept mapped count in the process's resident memory, so a long-lived handle would let
    the whole checkpoint's touched pages pile up on top of the shards."""

    def __enter__(self) -> "_Reader":
        from safetensors import safe_open

        self._open = safe_open
        self.bytes = 0
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def read(self, st: StoredTensor, index: Tuple[slice, ...]) -> torch.Tensor:
        with self._open(st.file, framework="pt") as handle:
            out = handle.get_tensor(st.key) if not st.shape else handle.get_slice(st.key)[index]
        self.bytes += out.numel() * out.element_size()
        return out


def _copy_direct(d: DirectPlan, reader: _Reader) -> None:
    shape = tuple(d.mt.global_shape)
    tensor = d.mt.tensor
    if d.padded:
        tensor.zero_()
    for region in regions_of(d.mt.spec):
        rbox = region.box(shape)
        for b in d.blocks:
            box = [(lo, lo + n) for lo, n in zip(b.lo, b.shape)]
            inter = [(max(r0, b0), min(r1, b1)) for (r0, r1), (b0, b1) in zip(rbox, box)]
            if any(lo >= hi for lo, hi in inter):
                continue
            shift = [region.local_start if dim == region.axis else 0 for dim in range(len(shape))]
            dst = tuple(slice(lo - r0 + s, hi - r0 + s)
                        for (lo, hi), (r0, _), s in zip(inter, rbox, shift))
            src = tuple(slice(lo - b0, hi - b0) for (lo, hi), (b0, _) in zip(inter, box))
            data = reader.read(b.src, src[b.squeeze:])
            tensor[dst].copy_(data.reshape([hi - lo for lo, hi in inter]))


def _copy_derived(g: DerivedGroup, reader: _Reader) -> None:
    """Each new tensor's local elements, gathered from the rows of the stored tensors that hold
    them (found by inverting the provenance re-layout on positions)."""
    total = sum(_numel(mt.global_shape) for mt in g.params)
    src_of = torch.full((total,), -1, dtype=torch.int64)
    bases, base = [], 0
    for i, st in enumerate(g.originals):
        pos = positions(g, i).reshape(-1)
        src_of[pos] = torch.arange(base, base + st.numel)
        bases.append(base)
        base += st.numel
    offset = 0
    for mt in g.params:
        shape = tuple(mt.global_shape)
        full = torch.arange(offset, offset + _numel(shape)).view(shape)
        offset += _numel(shape)
        spec = mt.spec
        need = (spec.slice_of(full) if spec is not None else full).reshape(-1)
        need = src_of[need]
        tensor = mt.tensor
        flat = torch.empty(need.numel(), dtype=tensor.dtype)
        for st, b in zip(g.originals, bases):
            sel = (need >= b) & (need < b + st.numel)
            if not bool(sel.any()):
                continue
            at = need[sel] - b
            row = st.numel // st.shape[0] if st.shape else 1
            lo, hi = int(at.min()) // row, int(at.max()) // row + 1
            chunk = reader.read(st, (slice(lo, hi),)).reshape(-1)
            flat[sel] = chunk[at - lo * row].to(flat.dtype)
        tensor.copy_(flat.view(tensor.shape))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
