"""The schedule tree: one :class:`Schedule` node per module position, addressed by path.

A path is exactly a name from ``model.named_modules()`` (``"bert.encoder.layer.0.attention"``),
so ``ModuleList``/``Sequential`` items are addressed by their index. The tree follows the module
tree lazily: after a primitive swaps a module, the nodes below it are rebuilt on next access,
while the node of the swapped position itself (and its metadata) is kept.

Every registered primitive is a method of ``Schedule``: the built-in ones are declared on its base
class :class:`~slapo.primitives.methods.PrimitiveMethods` (typed, for checkers and ``help()``),
ones registered later are bound when registered (see :mod:`slapo.primitives.registry`). Every
top-level primitive call is recorded in the root's :class:`~slapo.history.History`.
"""

from __future__ import annotations

import copy
import difflib
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Type

import torch.distributed as dist
from torch import nn

from .errors import PathError, RegistryError, SlapoError, describe_module, original_name
from .history import History
from .primitives.methods import PrimitiveMethods
from .primitives.registry import Primitive, PrimitiveMethod, check_original_kwargs, on_register

__all__ = ["Schedule", "create_schedule"]


class Schedule(PrimitiveMethods):
    """A node of the schedule tree: the module at ``path`` plus what was done to it.

    Attributes:
        mod: the module currently at this position.
        name: the last component of ``path`` ("" for the root).
        path: the dotted path from the root, as in ``named_modules()``.
        parent: the parent node (``None`` for the root).
        group: the tensor-parallel process group (``None`` = the default group).
        metadata: per-primitive information recorded on this position (used by ``explain``,
            verification and ``build``); a dict keyed by primitive name.
    """

    def __init__(
        self,
        mod: nn.Module,
        *,
        name: str = "",
        path: str = "",
        parent: Optional["Schedule"] = None,
        group: Optional[dist.ProcessGroup] = None,
    ):
        if not isinstance(mod, nn.Module):
            raise SlapoError(
                f"expected an nn.Module, got {type(mod).__name__}",
                call="create_schedule",
                hint="pass the model (an nn.Module instance) to create_schedule",
            )
        self.mod = mod
        self.name = name
        self.path = path
        self.parent = parent
        self.group = group
        self.metadata: Dict[str, Any] = {}
        self._children: Dict[str, Schedule] = {}
        self._depth = 0  # nesting level of primitive calls (root only)
        self._history: Optional[History] = (History(create_schedule) if parent is None
                                            else None)
        self._param_tags: set = set()  # used on the root only
        self.original: Optional[nn.Module] = None  # see create_schedule(keep_original=True)

    # ------------------------------------------------------------------ tree structure
    @property
    def root(self) -> "Schedule":
        """The root node of the tree."""
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    @property
    def history(self) -> History:
        """Every primitive call on this tree, in order (kept at the root)."""
        return self.root._history  # type: ignore[return-value]

    @property
    def param_tags(self) -> set:
        """Names of parameter attributes added by ``annotate`` (kept at the root); they are
        carried over whenever a primitive re-creates a parameter."""
        return self.root._param_tags

    @property
    def child(self) -> Dict[str, "Schedule"]:
        """Direct children, by name (as in ``mod.named_children()``)."""
        current = dict(self.mod.named_children())
        stale = [n for n, c in self._children.items() if current.get(n) is not c.mod]
        for n in stale:
            del self._children[n]
        for n, m in current.items():
            if n not in self._children:
                self._children[n] = Schedule(
                    m, name=n, path=self._join(n), parent=self, group=self.group
                )
        # keep the module's own order
        return {n: self._children[n] for n in current}

    def adopt(self, old_nodes: Dict[int, "Schedule"]) -> None:
        """Reuse ``old_nodes`` (keyed by module id) for modules now found below this node.

        Called after a module swap, so that metadata of modules that moved (e.g. into a wrapper)
        follows them to their new position.
        """
        for n, m in self.mod.named_children():
            node = old_nodes.get(id(m))
            if node is not None and node.mod is m:
                node.name, node.parent = n, self
                node._repath(self._join(n))
                self._children[n] = node
        for c in self.child.values():
            c.adopt(old_nodes)

    def subtree_nodes(self) -> Dict[int, "Schedule"]:
        """The nodes already created below this one, keyed by their module's id."""
        out: Dict[int, Schedule] = {}
        for c in self._children.values():
            out[id(c.mod)] = c
            out.update(c.subtree_nodes())
        return out

    def _repath(self, path: str) -> None:
        self.path = path
        for n, c in self._children.items():
            c._repath(self._join(n))

    def _join(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def named_schedules(
        self, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[Tuple[str, "Schedule"]]:
        """Pre-order ``(name, node)`` pairs, named exactly like ``mod.named_modules()``."""
        seen: set = set()

        def walk(node: Schedule, name: str):
            if remove_duplicate:
                if id(node.mod) in seen:
                    return
                seen.add(id(node.mod))
            yield name, node
            for n, c in node.child.items():
                yield from walk(c, f"{name}.{n}" if name else n)

        yield from walk(self, prefix)

    def __getitem__(self, path: str) -> "Schedule":
        if not isinstance(path, str):
            raise PathError(
                f"a schedule path must be a str, got {type(path).__name__}",
                path=self.path,
                hint="use the dotted name from named_modules(), e.g. sch['encoder.layer.0']",
            )
        if path == "":
            return self
        node = self
        for i, token in enumerate(path.split(".")):
            children = node.child
            if token not in children:
                done = ".".join(path.split(".")[:i])
                raise PathError(
                    f"no submodule '{token}' under '{done or self.path or '<root>'}'",
                    path=self._join(path),
                    hint=self._suggest(path, node, done),
                )
            node = children[token]
        return node

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str):
            return False
        try:
            self[path]
        except PathError:
            return False
        return True

    def _suggest(self, path: str, found: Optional["Schedule"] = None, done: str = "") -> str:
        """Close names under the deepest part of ``path`` that exists (``found`` at ``done``),
        else anywhere in this schedule's subtree."""
        if found is not None and done:
            rest = path[len(done) + 1:]
            under = [n for n, _ in found.mod.named_modules() if n]
            close = difflib.get_close_matches(rest, under, n=3, cutoff=0.5)
            if close:
                return "did you mean " + ", ".join(f"'{done}.{c}'" for c in close) + "?"
        names = [n for n, _ in self.mod.named_modules() if n]
        close = difflib.get_close_matches(path, names, n=3, cutoff=0.5)
        if close:
            return "did you mean " + ", ".join(f"'{c}'" for c in close) + "?"
        return "paths are names from model.named_modules(); e.g. " + ", ".join(
            f"'{n}'" for n in names[:3]
        )

    # ------------------------------------------------------------------ distributed info
    @property
    def world_size(self) -> int:
        """Size of ``group`` (1 when torch.distributed is not initialised)."""
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(self.group)
        return 1

    @property
    def rank(self) -> int:
        """This process's rank in ``group`` (0 when torch.distributed is not initialised)."""
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(self.group)
        return 0

    # ------------------------------------------------------------------ module swapping
    def swap_module(self, new_mod: nn.Module) -> None:
        """Put ``new_mod`` at this position (in the parent module, or as the root module).

        Nodes of modules that survive inside ``new_mod`` keep their metadata. This is the one
        place where the module tree is edited; primitives call it rather than ``setattr``.
        """
        old_nodes = self.subtree_nodes()
        old_mod, old_meta = self.mod, dict(self.metadata)
        if self.parent is not None:
            # ModuleList / Sequential items are registered under their index string too.
            setattr(self.parent.mod, self.name, new_mod)
        self.mod = new_mod
        self._children = {}
        self.adopt(old_nodes)
        # The replaced module may live on inside the new one (a wrapper): its node there starts
        # with the metadata this position had, while this position keeps its own.
        for _, node in self.named_schedules():
            if node is not self and node.mod is old_mod:
                node.metadata = {**old_meta, **node.metadata}

    # ------------------------------------------------------------------ primitives
    def _call_primitive(self, cls: Type[Primitive], args: tuple, kwargs: dict) -> Any:
        check_original_kwargs(cls, self, kwargs)
        root = self.root
        top_level = root._depth == 0 and cls.record
        entry = root.history.prepare(self.path, cls.name, args, kwargs) if top_level else None
        root._depth += 1
        try:
            result = cls.apply(self, *args, **kwargs)
        finally:
            root._depth -= 1
        if entry is not None:
            root.history.commit(entry)
        return result

    def describe(self) -> str:
        """``'path' (ModuleType ...)`` for messages."""
        return f"'{self.path or '<root>'}' ({describe_module(self.mod)})"

    def __repr__(self) -> str:
        return f"Schedule(path={self.path!r}, mod={describe_module(self.mod)})"

    if not TYPE_CHECKING:  # a checker must not take every unknown name for a valid one

        def __getattr__(self, name: str) -> Any:  # only for names normal lookup did not find
            raise original_name("Schedule", name, _ORIGINAL_METHODS)


# Schedule methods of the original Slapo that are spelled differently here (docs/porting.md).
_ORIGINAL_METHODS = {
    "find_node": "sch.find('regex') (or sch.find(where=lambda node: ...)) returns a list of "
                 "Subgraph objects; pass them to replace/fuse/checkpoint as they are",
    "find_subgraph": "sch.find(pattern) takes the pattern function or nn.Module itself and "
                     "returns a list of Subgraph objects",
    "get_module": "sch[path].mod (paths are names from model.named_modules())",
    "get_top_schedule": "sch.root",
}


# Instance attributes of Schedule (set in __init__), which a primitive must not shadow.
_INSTANCE_ATTRS = {"mod", "name", "path", "parent", "group", "metadata", "original"}


def _bind_primitive(cls: Type[Primitive]) -> None:
    """Make the registered primitive ``cls`` a method of ``Schedule`` (built-ins already are)."""
    existing = next((k.__dict__[cls.name] for k in Schedule.__mro__ if cls.name in k.__dict__),
                    None)
    if isinstance(existing, PrimitiveMethod) and existing.primitive is cls:
        return
    clash = cls.name in _INSTANCE_ATTRS or cls.name.startswith("_")
    if clash or (existing is not None and not isinstance(existing, PrimitiveMethod)):
        raise RegistryError(
            f"primitive name '{cls.name}' clashes with the Schedule attribute of that name",
            hint="choose another name for the primitive",
        )
    setattr(Schedule, cls.name, PrimitiveMethod(cls))


on_register(_bind_primitive)


def create_schedule(
    model: nn.Module, group: Optional[dist.ProcessGroup] = None, *, keep_original: bool = False
) -> Schedule:
    """Create the schedule of ``model``; the model itself is not modified until primitives run.

    Args:
        model: any ``nn.Module`` (e.g. a HuggingFace model built from a config).
        group: the tensor-parallel process group used by ``shard``/``sync`` (default: the whole
            world when torch.distributed is initialised, else a single process).
        keep_original: keep a deep copy of the unscheduled model as ``sch.original``, the
            default reference of ``slapo.verify`` (costs one copy of the weights; free for models
            on the meta device).
    """
    sch = Schedule(model, group=group)
    if keep_original:
        sch.original = copy.deepcopy(model)
    return sch


def paths_of(sch: Schedule) -> List[str]:
    """All module paths of the schedule's model (handy in error messages and docs)."""
    return [n for n, _ in sch.mod.named_modules()]
