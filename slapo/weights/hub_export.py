"""``slapo.export_pretrained``: a sharded, scheduled model back to a HuggingFace checkpoint.

Every tensor is gathered from its shards (one at a time, by :class:`~slapo.sharding.ShardSpec`)
and written by rank 0 under the name and in the layout ``from_pretrained`` expects: parameters a
schedule renamed or re-laid (fused ``qkv_proj``, GPT-2's transposed ``c_attn``) are rebuilt from
the op library's provenance records (:mod:`slapo.provenance`), fused experts
(``mlp.experts.gate_up_proj``) are split back per expert as transformers' checkpoint conversion
for the model type stores them, tied weights are written once. Files are size-sharded like
``save_pretrained``'s (``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` and
``model.safetensors.index.json``), next to the model's ``config.json``.

A pipelined model (``build``'s ``PipelineModel``: each rank holds one stage, whose parameters
keep their original paths) is gathered stage by stage: the TP rank 0 of each stage of the first
data-parallel replica converts its stage's tensors (TP shards gathered in the stage's TP group)
and sends them to rank 0, which writes them in stage order; a weight tied across stages is
written once.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn

from ..errors import CheckpointIOError
from ..provenance import derived_parameters
from .checkpoint_format import ModelTensor, model_tensors
from .hub_files import INDEX, SINGLE
from .hub_plan import conversions

__all__ = ["export_pretrained"]

CALL = "export_pretrained"
_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def _bytes(size: Union[int, str]) -> int:
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B)\s*", str(size), re.IGNORECASE)
    if not m:
        raise CheckpointIOError(f"max_shard_size {size!r} is not a size", call=CALL,
                                hint="pass bytes (an int) or e.g. '5GB', '500MB'")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _full(mt: ModelTensor, group) -> torch.Tensor:
    """The global value of ``mt`` (its shards gathered; every rank makes the same calls)."""
    t = mt.tensor.detach()
    spec = mt.spec
    if spec is None or spec.world_size == 1:
        return t
    if not (dist.is_available() and dist.is_initialized()):
        raise CheckpointIOError(f"'{mt.names[0]}' is sharded over {spec.world_size} ranks but "
                                "torch.distributed is not initialised", call=CALL,
                                hint="call export_pretrained on every rank of the run")
    chunks = [torch.empty_like(t) for _ in range(spec.world_size)]
    dist.all_gather(chunks, t.contiguous(), group=group)
    return spec.join(chunks)


def _hf_tensors(model: nn.Module, group, merges) -> Iterator[Tuple[str, torch.Tensor]]:
    """``(HF key, full tensor)`` for every tensor of ``model``, in the model's order
    (``merges``: the model type's expert merges, :func:`~slapo.weights.hub_plan.conversions`)."""
    tensors = model_tensors(model)
    by_name = {n: mt for mt in tensors for n in mt.names}
    derived = derived_parameters(model)
    uses: Dict[str, int] = {}
    for src in derived.values():
        for p in src.params:
            uses[by_name[p].names[0]] = uses.get(by_name[p].names[0], 0) + 1
    cache: Dict[str, torch.Tensor] = {}
    emitted = set()
    for mt in tensors:
        name = mt.names[0]
        if name not in uses:
            yield from _split_experts(name, _full(mt, group), merges)
            continue
        for original, src in derived.items():
            if original in emitted or name not in {by_name[p].names[0] for p in src.params}:
                continue
            args = []
            for p in src.params:
                key = by_name[p].names[0]
                if key not in cache:
                    cache[key] = _full(by_name[p], group)
                args.append(cache[key])
            emitted.add(original)
            yield original, src(*args)
            for p in src.params:
                key = by_name[p].names[0]
                uses[key] -= 1
                if uses[key] == 0:
                    cache.pop(key, None)


def _split_experts(name: str, full: torch.Tensor, merges) -> Iterator[Tuple[str, torch.Tensor]]:
    for sources, target, dim in merges:
        bare = target.lstrip(".")
        if not (name == bare or name.endswith("." + bare)):
            continue
        prefix = name[: len(name) - len(target)] if name.endswith(target) else ""
        for e in range(full.shape[0]):
            parts = [full[e]] if dim < 0 else list(full[e].chunk(len(sources), dim=dim - 1))
            for pattern, part in zip(sources, parts):
                yield prefix + pattern.replace("*", str(e)), part
        return
    yield name, full


def export_pretrained(target: Any, out_dir: str, *, group: Optional[Any] = None,
                      max_shard_size: Union[int, str] = "5GB",
                      dtype: Optional[torch.dtype] = None) -> str:
    """Write ``target`` (a built, possibly sharded model, or its ``Schedule``) as a HuggingFace
    checkpoint that ``AutoModel*.from_pretrained(out_dir)`` loads into the unscheduled model
    class with the same outputs.

    Every rank of ``group`` (default: all ranks) must call it; rank 0 writes. A pipelined model
    (``PipelineModel``) is gathered from its stages (every rank of the world calls it; ``group``
    must be left out).

    Args:
        max_shard_size: the most bytes per safetensors file (int, or a string like ``"5GB"``).
        dtype: convert floating tensors to this dtype (default: keep each tensor's).

    Returns:
        ``out_dir``.

    Raises:
        CheckpointIOError: a tensor on the meta device, a bad ``max_shard_size``, a sharded
            model without ``torch.distributed``.
    """
    from ..schedule import Schedule

    model = target.mod if isinstance(target, Schedule) else target
    pipelined = _is_pipeline(model)
    config_of = model
    if pipelined:
        if group is not None:
            raise CheckpointIOError("a group was given for a pipelined model", call=CALL,
                                    hint="leave group out: every rank of the world calls it")
        config_of, model = model, model.module
    if not isinstance(model, nn.Module):
        raise CheckpointIOError(f"expected a model or a Schedule, got {type(target).__name__}",
                                call=CALL, hint="pass the built model (or its schedule)")
    limit = _bytes(max_shard_size)
    meta = [mt.names[0] for mt in model_tensors(model) if mt.tensor.is_meta]
    if meta:
        raise CheckpointIOError(f"'{meta[0]}' is still on the meta device", call=CALL,
                                hint="load or initialise the weights (slapo.build) first")
    rank = dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0
    writer = _Writer(out_dir, limit) if rank == 0 else None
    merges = conversions(config_of)[1]
    items = _stage_tensors(config_of, merges) if pipelined else _hf_tensors(model, group, merges)
    for key, value in items:
        if writer is not None:
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype)
            writer.add(key, value)
    if writer is not None:
        writer.finish(config_of)
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=group)
    return out_dir


def _is_pipeline(model: Any) -> bool:
    """``build``'s ``PipelineModel`` (one stage per rank), without importing the dialects."""
    return not isinstance(model, nn.Module) and isinstance(getattr(model, "module", None),
                                                           nn.Module) and hasattr(model,
                                                                                  "stage_index")


def _stage_tensors(pipeline: Any, merges) -> Iterator[Tuple[str, torch.Tensor]]:
    """Every stage's ``(HF key, full tensor)`` on rank 0 (in stage order, each key once), nothing
    on the other ranks. Collective over the world."""
    from ..pipeline.runner import tied_parameters

    coords = pipeline.groups.coords
    sends = coords.tp_rank == 0 and coords.replica == 0
    # a weight tied across stages (GPT-2's lm_head and wte) is written by its first stage only
    later = {name for tie in tied_parameters(pipeline.stages) for stage, name in tie
             if stage == coords.stage and stage > min(s for s, _ in tie)}
    mine = [(k, v.detach().to("cpu").clone())
            for k, v in _hf_tensors(pipeline.module, pipeline.tp_group, merges) if k not in later]
    parts: List[Any] = [None] * dist.get_world_size()
    payload = (coords.stage, mine) if sends else None
    dist.gather_object(payload, parts if dist.get_rank() == 0 else None, dst=0)
    if dist.get_rank() != 0:
        return
    seen = set()
    for _, stage in sorted((p for p in parts if p is not None), key=lambda p: p[0]):
        for key, value in stage:
            if key not in seen:  # a weight tied across stages (both stages hold it)
                seen.add(key)
                yield key, value


class _Writer:
    """Size-sharded safetensors files, each written as soon as it is full (so rank 0 holds at
    most one file's tensors), renamed to ``model-0000i-of-0000n`` once ``n`` is known."""

    def __init__(self, out_dir: str, limit: int):
        os.makedirs(out_dir, exist_ok=True)
        for stale in os.listdir(out_dir):
            if stale.endswith(".safetensors") or stale == INDEX:
                os.remove(os.path.join(out_dir, stale))
        self.out_dir, self.limit = out_dir, limit
        self.current: Dict[str, torch.Tensor] = {}
        self.size = 0
        self.files: List[Tuple[str, List[str]]] = []
        self.total = 0

    def add(self, key: str, value: torch.Tensor) -> None:
        value = value.detach().to("cpu").contiguous().clone()
        nbytes = value.numel() * value.element_size()
        if self.current and self.size + nbytes > self.limit:
            self._flush()
        self.current[key] = value
        self.size += nbytes
        self.total += nbytes

    def _flush(self) -> None:
        from safetensors.torch import save_file

        name = f".partial-{len(self.files):05d}.safetensors"
        save_file(self.current, os.path.join(self.out_dir, name), metadata={"format": "pt"})
        self.files.append((name, list(self.current)))
        self.current, self.size = {}, 0

    def finish(self, model: nn.Module) -> None:
        self._flush()
        n = len(self.files)
        weight_map = {}
        for i, (partial, keys) in enumerate(self.files, start=1):
            fname = SINGLE if n == 1 else f"model-{i:05d}-of-{n:05d}.safetensors"
            os.replace(os.path.join(self.out_dir, partial), os.path.join(self.out_dir, fname))
            weight_map.update({k: fname for k in keys})
        if n > 1:
            with open(os.path.join(self.out_dir, INDEX), "w") as f:
                json.dump({"metadata": {"total_size": self.total}, "weight_map": weight_map},
                          f, indent=2)
        for attr in ("config", "generation_config"):
            cfg = getattr(model, attr, None)
            if cfg is not None and hasattr(cfg, "save_pretrained"):
                cfg.save_pretrained(self.out_dir)
