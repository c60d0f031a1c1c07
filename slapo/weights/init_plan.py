"""Planning delayed initialisation: which tensors each module's initialiser writes.

Materialisation (:func:`slapo.weights.delayed_init.materialize`) initialises a model *unit by unit*:
a unit is a set of modules whose initialisers write a common tensor, together with the tensors they
write. Usually a unit is one module and its own tensors (``Linear``: ``weight`` and ``bias``), but
some initialisers also write tensors of other modules: HF GPT-2 re-initialises
``attn.c_proj.weight`` from ``GPT2Attention``, ``nn.MultiheadAttention`` zeroes ``out_proj.bias``,
and a tied weight is written by both of its owners. Such modules are grouped into one unit so that
every tensor is materialised in full exactly once, receives every write, and is then sliced to this
rank's shard.

What an initialiser writes is found by a *dry run* on the meta device: every tensor of the model
is presented to it as a full-shape meta placeholder, and a dispatch mode records the storages that
in-place operations write (this sees ``p.data.normal_()``, views and ``copy_`` alike). The dry run
allocates nothing; an initialiser that cannot run on meta tensors is assumed to write exactly its
module's own tensors.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Set, Tuple

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ..sharding.spec import ShardSpec, get_shard_spec

__all__ = ["TensorEntry", "ModuleEntry", "TensorTable", "WriteRecorder", "plan_units"]


@dataclasses.dataclass
class TensorEntry:
    """One tensor of the model (tied tensors are one entry with several slots)."""

    key: int
    tensor: torch.Tensor  # the tensor currently installed in the model
    is_param: bool
    slots: List[Tuple[nn.Module, str]]  # every (module, attribute name) holding it
    name: str  # first qualified name, for messages
    spec: Optional[ShardSpec]
    placeholder: Optional[torch.Tensor] = None  # full-shape meta stand-in (created lazily)
    done: Optional[torch.Tensor] = None  # the materialised (local) tensor, once initialised

    @property
    def was_meta(self) -> bool:
        return self.tensor.is_meta

    @property
    def full_shape(self) -> Tuple[int, ...]:
        return tuple(self.spec.global_shape) if self.spec is not None else tuple(self.tensor.shape)

    def make(self, data: torch.Tensor) -> torch.Tensor:
        """Wrap ``data`` like the original (Parameter with its ``requires_grad``, or a plain
        buffer tensor)."""
        if self.is_param:
            return nn.Parameter(data, requires_grad=self.tensor.requires_grad)
        return data

    def meta_placeholder(self) -> torch.Tensor:
        if self.placeholder is None:
            self.placeholder = self.make(
                torch.empty(self.full_shape, dtype=self.tensor.dtype, device="meta"))
        return self.placeholder

    def install(self, value: torch.Tensor) -> None:
        """Put ``value`` into every slot of this tensor (so ties stay ties)."""
        for mod, attr in self.slots:
            table = mod._parameters if self.is_param else mod._buffers
            table[attr] = value

    def restore(self) -> None:
        """Put back the model's own tensor: the materialised one if done, else the original."""
        self.install(self.done if self.done is not None else self.tensor)

    def current(self) -> torch.Tensor:
        """What the first slot holds now (an initialiser may have replaced the object)."""
        mod, attr = self.slots[0]
        return (mod._parameters if self.is_param else mod._buffers)[attr]


@dataclasses.dataclass
class ModuleEntry:
    """A module position in post-order (children before parents, like HF's ``smart_apply``)."""

    index: int
    path: str
    module: nn.Module
    direct: List[int]  # keys of tensors this module holds itself
    subtree: List[int]  # indices (into the post-order list) of the modules below it and itself


class TensorTable:
    """Every tensor of ``model`` and every module, in post-order."""

    def __init__(self, model: nn.Module):
        self.entries: List[TensorEntry] = []
        self.modules: List[ModuleEntry] = []
        by_id: Dict[int, TensorEntry] = {}
        seen: Set[int] = set()

        def visit(mod: nn.Module, path: str) -> List[int]:
            seen.add(id(mod))
            below: List[int] = []
            for name, child in mod.named_children():
                if id(child) not in seen:
                    below += visit(child, f"{path}.{name}" if path else name)
            direct: List[int] = []
            for is_param, table in ((True, mod._parameters), (False, mod._buffers)):
                for attr, t in table.items():
                    if t is None:
                        continue
                    entry = by_id.get(id(t))
                    if entry is None:
                        qual = f"{path}.{attr}" if path else attr
                        entry = TensorEntry(len(self.entries), t, is_param, [], qual,
                                            get_shard_spec(t))
                        by_id[id(t)] = entry
                        self.entries.append(entry)
                    entry.slots.append((mod, attr))
                    direct.append(entry.key)
            index = len(self.modules)
            self.modules.append(ModuleEntry(index, path, mod, direct, below + [index]))
            return below + [index]

        visit(model, "")

    def meta_keys(self) -> List[int]:
        return [e.key for e in self.entries if e.was_meta]


class WriteRecorder(TorchDispatchMode):
    """Records the storages written by in-place / ``out=`` operations while active."""

    def __init__(self) -> None:
        super().__init__()
        self.written: Set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = kwargs.get(arg.name, args[i] if i < len(args) else None)
                if isinstance(value, torch.Tensor):
                    self.written.add(value.untyped_storage()._cdata)
        return func(*args, **kwargs)


def dry_run(
    table: TensorTable,
    call_init: Callable[[ModuleEntry], bool],
) -> Dict[int, Set[int]]:
    """For every module whose subtree holds a meta tensor: the keys its initialiser writes.

    ``call_init(entry)`` runs the initialiser of one module and returns whether there is one.
    Modules without an initialiser, or whose initialiser fails on meta tensors, are assumed to
    write exactly their own (direct) tensors, respectively nothing.
    """
    meta = set(table.meta_keys())
    storage_to_key = {}
    for e in table.entries:
        ph = e.meta_placeholder()
        storage_to_key[ph.untyped_storage()._cdata] = e.key
        e.install(ph)
    writes: Dict[int, Set[int]] = {}
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            for m in table.modules:
                if not any(k in meta for i in m.subtree for k in table.modules[i].direct):
                    continue
                recorder = WriteRecorder()
                try:
                    with recorder:
                        has_init = call_init(m)
                except Exception:  # noqa: BLE001 - cannot run on meta: assume own tensors
                    writes[m.index] = set(m.direct)
                    continue
                if has_init:
                    writes[m.index] = {storage_to_key[s] for s in recorder.written
                                       if s in storage_to_key}
    finally:
        for e in table.entries:
            e.restore()
    return writes


@dataclasses.dataclass
class Unit:
    """Modules (post-order indices) initialised together and the tensor keys they write."""

    modules: List[int]
    keys: List[int]


def plan_units(table: TensorTable, writes: Dict[int, Set[int]]) -> List[Unit]:
    """Group modules that write a common meta tensor (union-find); order by first module.

    Only writes to meta tensors make a module active; its writes to real tensors are then
    redirected to scratch copies (real tensors are never re-initialised).
    """
    meta = set(table.meta_keys())
    parent: Dict[int, int] = {}

    def find(x: int) -> int:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    writer_of: Dict[int, int] = {}
    active = [i for i in sorted(writes) if writes[i] & meta]
    for i in active:
        find(i)
        for k in writes[i] & meta:
            if k in writer_of:
                parent[find(i)] = find(writer_of[k])
            else:
                writer_of[k] = i
    groups: Dict[int, List[int]] = {}
    for i in active:
        groups.setdefault(find(i), []).append(i)
    units = []
    for mods in sorted(groups.values(), key=lambda g: g[0]):
        keys = sorted(set().union(*(writes[i] for i in mods)))
        units.append(Unit(mods, keys))
    return units
