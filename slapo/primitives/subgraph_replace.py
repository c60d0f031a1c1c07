"""Subgraph forms of ``replace`` and ``checkpoint`` (and the region extraction ``fuse`` uses).

A subgraph (from ``find``) lives in one traced GraphModule (its *owner*). ``replace`` swaps its
nodes for one call of a new module or function: *vertical* for one subgraph (the call takes the
subgraph's inputs and produces its output), *horizontal* for several (the call takes the union
of their inputs and returns a tuple, item ``i`` replacing subgraph ``i``'s output, e.g. three
q/k/v linears -> one fused linear). Arity is checked before anything is registered, so a failed
call leaves the model untouched (fix of the original's leaked ``X_0``).

``checkpoint``/``fuse`` move the subgraph into a :class:`RegionModule`: a parameter-free module
that runs a GraphModule of the subgraph, whose modules are the *owner's* modules (not
registered below the region), so parameter paths and ``state_dict`` keys do not change.
"""

from __future__ import annotations

import heapq
import inspect
import operator
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch.fx as fx
from torch import nn

from ..errors import ReplaceError
from ..runtime.activation_checkpoint import checkpoint as rng_exact_checkpoint
from ..runtime.forward_wrap import move_hooks
from ..trace.pattern import Subgraph
from .module_checks import format_call

__all__ = ["replace_subgraph", "checkpoint_subgraph", "RegionModule", "extract_region",
           "as_subgraphs", "insert_region"]


class RegionModule(nn.Module):
    """Runs an extracted subgraph (checkpointed and/or compiled) without owning its modules."""

    _region: fx.GraphModule  # a plain attribute, not a submodule (see __init__)

    def __init__(self, region: fx.GraphModule, kind: str, compiler: Optional[str] = None):
        super().__init__()
        object.__setattr__(self, "_region", region)  # hidden: not a submodule
        self.kind, self.compiler = kind, compiler
        self._compiled: Optional[Callable] = None

    def _runner(self) -> Callable:
        region = self._region
        if self.compiler is None:
            return region
        compiled = self._compiled
        if compiled is None:
            import torch

            # hidden like _region: registered, the compiled module would add the region's
            # modules to state_dict and the schedule tree after the first call
            compiled = torch.compile(region, backend=self.compiler)
            object.__setattr__(self, "_compiled", compiled)
        return compiled

    def forward(self, *args: Any) -> Any:
        if self.kind == "checkpoint":
            return rng_exact_checkpoint(self._runner(), *args)
        return self._runner()(*args)

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_compiled"] = None  # compiled artefacts are rebuilt lazily
        return state

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, compiler={self.compiler!r}"


def as_subgraphs(sch, subgraph: Any, call: str) -> List[Subgraph]:
    """Validate ``subgraph`` (one or a list) against the current graph of its owner."""
    items = [subgraph] if isinstance(subgraph, Subgraph) else subgraph
    if not isinstance(items, (list, tuple)) or not items or not all(
            isinstance(s, Subgraph) for s in items):
        raise ReplaceError(f"expected a subgraph from find(), got {type(subgraph).__name__}",
                           path=sch.path, call=call, module=sch.mod,
                           hint="pass sch.find(...) or one of its items")
    owners = {s.owner for s in items}
    if len(owners) > 1:
        raise ReplaceError(f"the subgraphs live in different traced modules: {sorted(owners)}",
                           path=sch.path, call=call, module=sch.mod,
                           hint="replace subgraphs of one traced module at a time")
    owner = items[0].owner
    if not (sch.path == "" or owner == sch.path or owner.startswith(sch.path + ".")):
        raise ReplaceError(f"the subgraph belongs to '{owner}', outside this module",
                           path=sch.path, call=call, module=sch.mod,
                           hint=f"call it on sch[{owner!r}]")
    gm = sch.root[owner].mod if owner in sch.root else None
    live = isinstance(gm, fx.GraphModule) and all(
        n.graph is gm.graph and n in gm.graph.nodes for s in items for n in s.nodes)
    if not live:
        raise ReplaceError("the subgraph is stale (its module was re-traced or edited)",
                           path=sch.path, call=call, module=sch.mod,
                           hint="call find(...) again right before using its result")
    return list(items)


def _unique(gm: nn.Module, base: str) -> str:
    base = base.replace(".", "_")
    i = 0
    while hasattr(gm, f"{base}_{i}"):
        i += 1
    return f"{base}_{i}"


def _check_arity(sch, new: Any, args: Sequence[Any], kwargs: Dict[str, Any], call: str) -> None:
    fn = new.forward if isinstance(new, nn.Module) else new
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        raise ReplaceError(
            f"{getattr(new, '__name__', type(new).__name__)} cannot be called with the "
            f"subgraph's {len(args)} input(s){' and ' + ', '.join(kwargs) if kwargs else ''}: {e}",
            path=sch.path, call=call, module=sch.mod,
            hint="its forward must take the subgraph inputs in order (see Subgraph.inputs); "
            "pass extra constants with concrete_args={...}",
        ) from None


def _ancestors(nodes: Sequence[Any]) -> set:
    seen: set = set()
    stack = [n for n in nodes if isinstance(n, fx.Node)]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen


def toposort(graph: fx.Graph) -> None:
    """Reorder ``graph`` topologically, keeping the original order where it is free."""
    nodes = list(graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    indeg = {n: len(set(n.all_input_nodes)) for n in nodes}
    ready = [(pos[n], n.name) for n in nodes if indeg[n] == 0]
    by_name = {n.name: n for n in nodes}
    heapq.heapify(ready)
    out: List[fx.Node] = []
    while ready:
        _, name = heapq.heappop(ready)
        n = by_name[name]
        out.append(n)
        for u in n.users:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, (pos[u], u.name))
    assert len(out) == len(nodes), "cycle in graph"
    for a, b in zip(out, out[1:]):
        a.append(b)


def _finish(gm: fx.GraphModule) -> None:
    toposort(gm.graph)
    gm.graph.lint()
    gm.recompile()


def _erase(gm: fx.GraphModule, subgraphs: Sequence[Subgraph], drop_modules: bool) -> None:
    targets = set()  # module targets are str (fx types a node's target as str | Callable)
    for s in subgraphs:
        for n in reversed(s.nodes):
            if n.op == "call_module":
                targets.add(str(n.target))
            gm.graph.erase_node(n)
    if drop_modules:
        used = {str(n.target) for n in gm.graph.nodes if n.op in ("call_module", "get_attr")}
        for t in targets:
            if not any(u == t or u.startswith(t + ".") for u in used):
                gm.delete_submodule(t)


def _hooked(gm: fx.GraphModule, s: Subgraph) -> List[str]:
    out = []
    for n in s.nodes:
        if n.op == "call_module":
            m = gm.get_submodule(str(n.target))
            if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks:
                out.append(str(n.target))
    return out


def replace_subgraph(sch, new: Union[nn.Module, Callable], subgraph: Any,
                     name: Optional[str] = None,
                     concrete_args: Optional[Dict[str, Any]] = None) -> Any:
    """Replace subgraph(s) from ``find`` by one call of ``new`` (see module docstring).

    Returns the new ``fx.Node``'s module (or the function).

    Raises:
        ReplaceError: not a subgraph / stale / outside this module; ``new`` not callable with
            the subgraph inputs; hooks on modules inside a multi-node subgraph; horizontal
            subgraphs that depend on each other; ``name`` already taken.
    """
    call = format_call("replace", new, subgraph)
    items = as_subgraphs(sch, subgraph, call)
    owner = sch.root[items[0].owner]
    gm: fx.GraphModule = owner.mod
    if not callable(new):
        raise ReplaceError(f"{type(new).__name__} is not callable", path=sch.path, call=call,
                           module=sch.mod, hint="pass an nn.Module or a function")
    kwargs = dict(concrete_args or {})
    if len(items) == 1 and len(items[0].nodes) == 1:
        node = items[0].nodes[0]
        args, kwargs = list(node.args), {**node.kwargs, **kwargs}
    else:
        args = []
        for s in items:
            args.extend(i for i in s.inputs if not any(i is a for a in args))
    for s in items:
        hooked = _hooked(gm, s)
        if hooked and (len(items) > 1 or len(s.nodes) > 1):
            raise ReplaceError(
                f"module(s) {', '.join(hooked)} inside the subgraph have hooks (e.g. from sync); "
                "the subgraph becomes one call, so no hook would see that module's own input, "
                "output or gradient any more (the original moved the first module's pre-hook "
                "and the last one's hook and refused the rest; we refuse rather than guess)",
                path=sch.path, call=call, module=sch.mod,
                hint="replace the subgraph before adding the hooks (then sync the new module), "
                "or move the hooks to the enclosing module, or replace those modules one by one")
    if len(items) > 1:
        inner = {n for s in items for n in s.nodes}
        if _ancestors([a for a in args if isinstance(a, fx.Node)]) & inner:
            raise ReplaceError("the subgraphs depend on each other; they cannot run as one "
                               "call", path=sch.path, call=call, module=sch.mod,
                               hint="fuse only independent subgraphs (e.g. q/k/v projections)")
    _check_arity(sch, new, args, kwargs, call)
    if isinstance(new, nn.Module):
        if name is not None and hasattr(gm, name):
            raise ReplaceError(f"'{name}' is already an attribute of '{owner.path}'",
                               path=sch.path, call=call, module=sch.mod,
                               hint="choose another name or leave name=None")
        target = name or _unique(gm, type(new).__name__)
        if len(items) == 1 and len(items[0].nodes) == 1 and items[0].nodes[0].op == "call_module":
            move_hooks(gm.get_submodule(str(items[0].nodes[0].target)), new)
        gm.add_module(target, new)
    first = min((s.output for s in items), key=list(gm.graph.nodes).index)
    with gm.graph.inserting_before(first):
        if isinstance(new, nn.Module):
            new_node = gm.graph.call_module(target, tuple(args), kwargs)
        else:
            new_node = gm.graph.call_function(new, tuple(args), kwargs)
    if len(items) == 1:
        items[0].output.replace_all_uses_with(new_node)
    else:
        for i, s in enumerate(items):
            with gm.graph.inserting_after(new_node):
                item = gm.graph.call_function(operator.getitem, (new_node, i))
            s.output.replace_all_uses_with(item)
    _erase(gm, items, drop_modules=True)
    _finish(gm)
    new_name = getattr(new, "__name__", type(new).__name__)
    sch.metadata.setdefault("replace", []).append(
        f"{len(items)} subgraph(s) in '{owner.path}' -> {new_name}")
    return new


def extract_region(gm: fx.GraphModule, s: Subgraph) -> fx.GraphModule:
    """A GraphModule computing ``s`` from its node inputs; it shares ``gm``'s modules."""
    graph = fx.Graph()
    env: Dict[fx.Node, fx.Node] = {}
    for i, value in enumerate(s.inputs):
        if isinstance(value, fx.Node):
            env[value] = graph.placeholder(f"in_{i}")
    for n in s.nodes:
        env[n] = graph.node_copy(n, lambda x: env[x])
    graph.output(env[s.output])
    return fx.GraphModule(gm, graph, class_name="Region")


def insert_region(sch, s: Subgraph, region: RegionModule, base: str) -> str:
    """Register ``region`` on the owner and call it in place of ``s``; returns its name."""
    owner = sch.root[s.owner]
    gm: fx.GraphModule = owner.mod
    target = _unique(gm, base)
    gm.add_module(target, region)
    with gm.graph.inserting_before(s.output):
        node = gm.graph.call_module(target, tuple(v for v in s.inputs if isinstance(v, fx.Node)))
    s.output.replace_all_uses_with(node)
    _erase(gm, [s], drop_modules=False)
    _finish(gm)
    return target


def checkpoint_subgraph(sch, subgraph: Any) -> str:
    """Recompute one subgraph in backward (see module docstring); returns the region name.

    Raises:
        ReplaceError: as for :func:`replace_subgraph` (one subgraph only).
    """
    call = format_call("checkpoint", subgraph)
    items = as_subgraphs(sch, subgraph, call)
    if len(items) != 1:
        raise ReplaceError(f"checkpoint takes one subgraph, got {len(items)}", path=sch.path,
                           call=call, module=sch.mod, hint="checkpoint each one separately")
    s = items[0]
    gm = sch.root[s.owner].mod
    name = insert_region(sch, s, RegionModule(extract_region(gm, s), "checkpoint"),
                         "checkpoint")
    sch.metadata.setdefault("checkpoint_subgraphs", []).append(name)
    return name
