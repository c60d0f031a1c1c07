"""Where each tensor of a (scheduled) model comes from in a HuggingFace checkpoint.

Three ways, tried in order for every parameter and persistent buffer (tied names grouped):

* **direct**: a stored tensor of the same name (or the name without / with the model's
  ``base_model_prefix``, as ``from_pretrained`` allows) holds the whole global tensor. The
  word embedding and the LM head (and its bias) may have *more* rows than stored (a vocabulary
  padded to a multiple of the tensor-parallel size): the extra rows are zeros.
* **merged experts**: transformers' own checkpoint conversion for the model type
  (``transformers.conversion_mapping``: ``MergeModulelist`` then ``Concatenate``) says a fused
  tensor such as ``mlp.experts.gate_up_proj [E, 2I, H]`` is made of per-expert stored tensors
  ``mlp.experts.<e>.{gate,up}_proj.weight [I, H]``; each is a block of it.
* **derived**: the schedule replaced the module and renamed or re-laid the parameter (fused
  ``qkv_proj``, GPT-2's transposed ``c_attn``); the op library's provenance records
  (:mod:`slapo.provenance`) say how the HF tensors are re-laid from the new ones, and applying
  that re-layout to *positions* (an ``arange``) instead of values inverts it exactly.

Direct and merged tensors are lists of :class:`Block` s (a stored tensor placed in a box of the
global tensor), so each rank reads only the overlap of its shard's regions with each block.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..errors import CheckpointIOError
from ..provenance import Source, derived_parameters
from .checkpoint_format import ModelTensor, model_tensors
from .hub_files import StoredTensor

__all__ = ["Block", "DirectPlan", "DerivedGroup", "HubPlan", "plan_hub_load", "positions",
           "conversions"]

CALL = "load_pretrained"


@dataclasses.dataclass(frozen=True)
class Block:
    """Stored tensor ``src`` fills the box ``[lo, lo + shape)`` of a model tensor's global value;
    its stored shape is ``shape`` without the first ``squeeze`` (size-1) dimensions."""

    src: StoredTensor
    lo: Tuple[int, ...]
    shape: Tuple[int, ...]
    squeeze: int = 0


@dataclasses.dataclass
class DirectPlan:
    """A model tensor filled from blocks; ``padded``: rows past the blocks are zeros."""

    mt: ModelTensor
    blocks: List[Block]
    padded: bool = False


@dataclasses.dataclass
class DerivedGroup:
    """New parameters (``params``, model tensors) that together hold the stored ``originals``:
    ``sources[i]`` rebuilds ``originals[i]`` from the full new tensors."""

    params: List[ModelTensor]
    originals: List[StoredTensor]
    sources: List[Source]


@dataclasses.dataclass
class HubPlan:
    """What to load: ``direct`` and ``derived`` tensors, and the stored keys they consume."""

    direct: List[DirectPlan]
    derived: List[DerivedGroup]
    used: List[str]


def _fail(what: str, hint: str) -> CheckpointIOError:
    return CheckpointIOError(what, call=CALL, hint=hint)


def _shape(shape: Sequence[int]) -> List[int]:
    return [int(s) for s in shape]


def conversions(model: nn.Module) -> Tuple[List[Tuple[str, str]], List[Tuple[List[str], str,
                                                                               int]]]:
    """The model type's checkpoint conversions that slapo applies: renamings (regex, target)
    and expert merges ``(source patterns with '*', target suffix, concat dim or -1)``."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type is None:
        return [], []
    try:
        from transformers import conversion_mapping as cm
        from transformers.core_model_loading import (Concatenate, MergeModulelist,
                                                     WeightConverter, WeightRenaming)
        convs = cm.get_checkpoint_conversion_mapping(model_type) or []
    except (ImportError, AttributeError):  # another transformers: no conversions known
        return [], []
    renames, merges = [], []
    for c in convs:
        if isinstance(c, WeightRenaming) and len(c.source_patterns) == 1:
            renames.append((c.source_patterns[0], c.target_patterns[0]))
        elif isinstance(c, WeightConverter) and len(c.target_patterns) == 1:
            ops = c.operations
            merge = bool(ops) and isinstance(ops[0], MergeModulelist) and \
                getattr(ops[0], "dim", 0) == 0
            if merge and (len(ops) == 1 or (len(ops) == 2 and isinstance(ops[1], Concatenate))):
                dim = getattr(ops[1], "dim", 0) if len(ops) == 2 else -1
                merges.append((list(c.source_patterns), c.target_patterns[0], dim))
    return renames, merges


class _Lookup:
    """Stored tensors by (renamed) key, found under a model name with or without the model's
    ``base_model_prefix``."""

    def __init__(self, stored: Dict[str, StoredTensor], renames, base: str):
        self.by_key: Dict[str, StoredTensor] = {}
        for key, t in stored.items():
            for pattern, target in renames:
                key = re.sub(pattern, target, key)
            self.by_key[key] = t
        self.base = base

    def find(self, name: str) -> Optional[str]:
        if name in self.by_key:
            return name
        b = self.base
        if b and name.startswith(b + ".") and name[len(b) + 1:] in self.by_key:
            return name[len(b) + 1:]
        if b and f"{b}.{name}" in self.by_key:
            return f"{b}.{name}"
        return None


def _embedding_tensors(model: nn.Module) -> set:
    """ids of the word embedding's and the LM head's tensors (rows may be padded)."""
    out: set = set()
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        fn = getattr(model, getter, None)
        try:
            mod = fn() if callable(fn) else None
        except (NotImplementedError, AttributeError):
            mod = None
        if isinstance(mod, nn.Module):
            out.update(id(t) for t in mod.parameters(recurse=False))
    return out


def _direct(mt: ModelTensor, name: str, st: StoredTensor, key: str, paddable: bool
            ) -> DirectPlan:
    want, got = tuple(mt.global_shape), tuple(st.shape)
    if got == want:
        return DirectPlan(mt, [Block(st, (0,) * len(want), want)])
    if paddable and len(got) == len(want) and got[1:] == want[1:] and got[0] < want[0]:
        return DirectPlan(mt, [Block(st, (0,) * len(want), got)], padded=True)
    raise _fail(f"'{key}' in the checkpoint has shape {_shape(got)} but the model's '{name}' "
                f"is {_shape(want)}", "build the model from the checkpoint's config.json")


def _merged(mt: ModelTensor, name: str, lookup: _Lookup, merges) -> Optional[DirectPlan]:
    for sources, target, dim in merges:
        bare = target.lstrip(".")
        if not (name == bare or name.endswith("." + bare)):
            continue
        prefix = name[: len(name) - len(target)] if name.endswith(target) else ""
        shape = tuple(mt.global_shape)
        blocks, offset = [], 0
        for pattern in sources:
            sizes = set()
            for e in range(shape[0]):
                key = lookup.find(prefix + pattern.replace("*", str(e)))
                if key is None:
                    return None
                st = lookup.by_key[key]
                sizes.add(tuple(st.shape))
                box = (1, *st.shape)
                if len(box) != len(shape) or (dim < 0 and box[1:] != shape[1:]):
                    raise _fail(f"'{key}' has shape {_shape(st.shape)}, which does not stack "
                                f"into the model's '{name}' {_shape(shape)}",
                                "build the model from the checkpoint's config.json")
                lo = [e] + [0] * (len(shape) - 1)
                if dim > 0:
                    lo[dim] = offset
                blocks.append(Block(st, tuple(lo), box, squeeze=1))
            if dim > 0 and len(sizes) == 1:
                offset += next(iter(sizes))[dim - 1]
        if dim > 0 and offset != shape[dim]:
            raise _fail(f"the stored parts of '{name}' add up to {offset} along axis {dim} but "
                        f"the model has {shape[dim]}",
                        "build the model from the checkpoint's config.json")
        return DirectPlan(mt, blocks)
    return None


def positions(group: DerivedGroup, index: int) -> torch.Tensor:
    """Where each element of stored tensor ``originals[index]`` lies in the concatenation of
    the group's flattened full new tensors (the provenance re-layout applied to positions)."""
    offsets, start = {}, 0
    for mt in group.params:
        offsets[mt.names[0]] = start
        start += _numel(mt.global_shape)
    src = group.sources[index]
    args = [torch.arange(offsets[p], offsets[p] + _numel(_global(group, p))).view(
        _global(group, p)) for p in src.params]
    return src(*args)


def _global(group: DerivedGroup, name: str) -> Tuple[int, ...]:
    return next(tuple(mt.global_shape) for mt in group.params if mt.names[0] == name)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _derived_groups(model: nn.Module, pending: List[ModelTensor], lookup: _Lookup,
                    prefix: str) -> Tuple[List[DerivedGroup], List[ModelTensor]]:
    """Group the pending tensors by the provenance records that fill them."""
    derived = derived_parameters(model)
    by_name = {n: mt for mt in pending for n in mt.names}
    groups: List[DerivedGroup] = []
    owner: Dict[str, int] = {}
    for original, src in derived.items():
        if not all(p in by_name for p in src.params):
            continue
        key = lookup.find(_join(prefix, original))
        if key is None:
            continue
        hit = {owner[p] for p in src.params if p in owner}
        if hit:
            gi = min(hit)
            for other in sorted(hit - {gi}, reverse=True):  # merge groups sharing a tensor
                g = groups.pop(other)
                groups[gi].params += g.params
                groups[gi].originals += g.originals
                groups[gi].sources += g.sources
            g = groups[gi]
        else:
            g = DerivedGroup([], [], [])
            groups.append(g)
        for p in src.params:
            if all(mt.names[0] != by_name[p].names[0] for mt in g.params):
                g.params.append(by_name[p])
        g.originals.append(lookup.by_key[key])
        g.sources.append(Source(tuple(by_name[p].names[0] for p in src.params),
                                src.to_original))
        owner = {mt.names[0]: i for i, grp in enumerate(groups) for mt in grp.params}
    covered = {mt.names[0] for g in groups for mt in g.params}
    return groups, [mt for mt in pending if mt.names[0] not in covered]


def _check_derived(group: DerivedGroup) -> None:
    total = sum(_numel(mt.global_shape) for mt in group.params)
    count = torch.zeros(total, dtype=torch.int32)
    for i, st in enumerate(group.originals):
        pos = positions(group, i)
        if tuple(pos.shape) != tuple(st.shape):
            raise _fail(f"'{st.key}' in the checkpoint has shape {_shape(st.shape)} but the model "
                        f"(through {', '.join(mt.names[0] for mt in group.params)}) expects "
                        f"{_shape(pos.shape)}", "build the model from the checkpoint's config.json")
        count.index_add_(0, pos.reshape(-1), torch.ones(pos.numel(), dtype=torch.int32))
    if bool((count != 1).any()):
        names = ", ".join(mt.names[0] for mt in group.params)
        stored = ", ".join(st.key for st in group.originals)
        raise _fail(f"{stored} do not fill {names} exactly once",
                    "the replacement's provenance records are incomplete; load the weights "
                    "before replacing the module (or record every parameter's provenance)")


def plan_hub_load(model: nn.Module, stored: Dict[str, StoredTensor], prefix: str = ""
                  ) -> HubPlan:
    """Map every parameter and persistent buffer of ``model`` to stored tensors, checking names
    and shapes (nothing is read or written).

    Raises:
        CheckpointIOError: a parameter no stored tensor fills, a shape that differs, stored parts
            that do not tile a fused tensor.
    """
    renames, merges = conversions(model)
    lookup = _Lookup(stored, renames, getattr(model, "base_model_prefix", "") or "")
    paddable = _embedding_tensors(model)
    direct: List[DirectPlan] = []
    pending: List[ModelTensor] = []
    for mt in model_tensors(model):
        key = next((k for k in (lookup.find(_join(prefix, n)) for n in mt.names) if k), None)
        if key is not None:
            direct.append(_direct(mt, mt.names[0], lookup.by_key[key], key,
                                  id(mt.tensor) in paddable))
            continue
        plan = _merged(mt, _join(prefix, mt.names[0]), lookup, merges)
        if plan is not None:
            direct.append(plan)
        else:
            pending.append(mt)
    derived, missing = _derived_groups(model, pending, lookup, prefix)
    for group in derived:
        _check_derived(group)
    missing = [mt for mt in missing if mt.kind == "param" or mt.tensor.is_meta]
    if missing:
        names = [mt.names[0] for mt in missing]
        shown = ", ".join(f"'{n}'" for n in names[:4]) + (" ..." if len(names) > 4 else "")
        raise _fail(f"{len(names)} model tensor(s) are not in the checkpoint: {shown}",
                    "load the checkpoint of this architecture (check the model class and "
                    "config.json)")
    used = [b.src.key for d in direct for b in d.blocks]
    used += [st.key for g in derived for st in g.originals]
    return HubPlan(direct, derived, used)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
