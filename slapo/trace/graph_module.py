"""From a traced graph to the ``fx.GraphModule`` that takes the module's place: dead value
reads dropped, the grad-mode / autocast guard and the config / module-flag guard added, and the
module's children, tensors, plain attributes, hooks and forward wrappers carried over (same
objects, same names)."""

from __future__ import annotations

import contextlib
import copy
import operator
from typing import Callable, Iterator

import torch.fx as fx
from torch import nn

from ..runtime.forward_wrap import copy_forward_wrappers, move_hooks
from .baked import BakedState, ConfigReads, check_baked
from .guards import check_global_state
from .original import keep_original

__all__ = ["drop_dead_reads", "guard_global_state", "guard_baked_state", "graph_module",
           "TracedGraphModule"]

_BAKED = "_slapo_baked"  # the traced module's BakedState (a get_attr target)


def guard_global_state(graph: fx.Graph, reads: list, path: str) -> None:
    """One guard after the placeholders for the grad-mode / autocast answers the trace fixed."""
    if not reads:
        return
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    where = (graph.inserting_after(placeholders[-1]) if placeholders
             else graph.inserting_before(next(iter(graph.nodes))))
    with where:
        graph.call_function(check_global_state, (tuple(reads), path))


def _inlined(mod: nn.Module, graph: fx.Graph) -> list:
    """``(path, module)`` of the modules whose code the graph inlined: all but the module
    calls (leaves) and what is inside them."""
    leaves = {n.target for n in graph.nodes if n.op == "call_module"}

    def inside_leaf(path: str) -> bool:
        while path:
            if path in leaves:
                return True
            path = path.rpartition(".")[0]
        return False

    return [(p, m) for p, m in mod.named_modules() if not inside_leaf(p)]


@contextlib.contextmanager
def guard_baked_state(mod: nn.Module, graph: fx.Graph, reads: ConfigReads, path: str
                      ) -> Iterator[Callable[[nn.Module], None]]:
    """A :func:`~slapo.trace.baked.check_baked` guard after the placeholders for the config
    attributes and module flags the trace fixed; inside the block ``mod`` holds the state
    for :func:`graph_module` to copy, and the yielded function binds it to the graph module."""
    state = BakedState.of(reads, mod, _inlined(mod, graph))
    if not state:
        yield lambda gm: None
        return
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    where = (graph.inserting_after(placeholders[-1]) if placeholders
             else graph.inserting_before(next(iter(graph.nodes))))
    with where:
        holder = graph.create_node("get_attr", _BAKED)  # create_node: not a tensor, no warning
    with graph.inserting_after(holder):
        graph.call_function(check_baked, (holder, path))
    mod.__dict__[_BAKED] = state
    try:
        yield state.bind_root
    finally:
        mod.__dict__.pop(_BAKED, None)


_PURE_FUNCS = {getattr, operator.getitem, operator.gt, operator.lt, operator.ge, operator.le,
               operator.eq, operator.ne, operator.not_, operator.and_, operator.or_}


def drop_dead_reads(graph: fx.Graph) -> None:
    """Remove unused attribute reads and comparisons left behind by value inspection (side
    effect free; anything else, e.g. in-place ops, is kept)."""
    for node in reversed(list(graph.nodes)):
        if node.users:
            continue
        if node.op == "get_attr" or (node.op == "call_function"
                                     and node.target in _PURE_FUNCS) or (
                node.op == "call_method" and node.target in ("size", "dim")):
            graph.erase_node(node)


class TracedGraphModule(fx.GraphModule):
    """The GraphModule of a traced module; its ``copy.deepcopy`` is a copy of all of it.

    ``fx.GraphModule.__deepcopy__`` rebuilds the copy from the graph: it keeps only the
    modules and tensors the graph names (an intermediate module of a dotted target becomes an
    empty ``nn.Module``), and drops plain attributes (``config``, a bound
    ``gradient_checkpointing`` the guards check, the kept original), hooks and forward
    wrappers, so the copy of a traced model (``slapo.Verify``'s snapshot) refused to run or
    lost state. Here every entry of the module's ``__dict__`` is copied as well."""

    def __deepcopy__(self, memo: dict) -> fx.GraphModule:
        res = super().__deepcopy__(memo)
        type(res).__name__ = type(self).__name__  # the traced class's name, as fx gave it
        for k, v in self.__dict__.items():
            if k in _MODULE_STATE or k not in res.__dict__ or (
                    k.startswith(_HOOKS) and v):
                res.__dict__[k] = copy.deepcopy(v, memo)
        return res


_MODULE_STATE = ("_modules", "_parameters", "_buffers", "_non_persistent_buffers_set")
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
          "_is_full_backward_hook")


def graph_module(mod: nn.Module, graph: fx.Graph) -> fx.GraphModule:
    """A GraphModule for ``graph`` with exactly ``mod``'s children, parameters, buffers (in
    order, same objects), plain attributes, hooks and forward wrappers."""
    gm = TracedGraphModule(mod, graph, class_name=type(mod).__name__)
    constants = [n.target for n in graph.nodes
                 if n.op == "get_attr" and n.target.startswith("_tensor_constant")]
    gm._modules.clear()
    gm._modules.update(mod._modules)
    gm._parameters.clear()
    gm._parameters.update(mod._parameters)
    buffers = dict(mod._buffers)
    gm._buffers.clear()
    gm._buffers.update(buffers)
    gm._non_persistent_buffers_set = set(mod._non_persistent_buffers_set)
    for name in constants:  # tensors created during tracing: not part of the state dict
        value = mod.__dict__.pop(name, None)
        if value is None:
            value = getattr(gm, name)
        gm.register_buffer(name, value, persistent=False)
    for k, v in mod.__dict__.items():
        if k.startswith("_") or k in ("training", "forward") or k in gm.__dict__:
            continue
        gm.__dict__[k] = v
    gm.train(mod.training)
    gm.meta["slapo_traced_from"] = type(mod)
    keep_original(mod, gm)
    move_hooks(mod, gm)
    copy_forward_wrappers(mod, gm)
    gm.graph.lint()
    return gm
