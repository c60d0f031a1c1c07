"""Mode-exact traces: a traced module computes what the module computes in training *and* in
evaluation mode, or refuses to run in the mode it cannot compute.

Python code reads ``self.training`` and the tracer answers with the value it has while tracing,
so a single trace fixes the answer: HF's ``BertSelfAttention`` computes ``dropout_p =
self.dropout.p if self.training else 0.0`` and a trace in training mode records
``scaled_dot_product_attention(..., dropout_p=0.1)``, which then drops attention probabilities
in evaluation mode too. (Leaf modules such as ``nn.Dropout`` and ``nn.BatchNorm2d`` are
``call_module`` nodes that read their own mode at run time; they are exact already.)

The tracer therefore traces the region once in each mode (:func:`merge_modes`) and compares the
two graphs node by node:

* identical: the graph does not depend on the mode; nothing is added;
* the same operations, some literal arguments differ (``dropout_p`` 0.1 / 0.0, ``training``
  True / False): each such argument becomes a :func:`by_mode` node that picks the value of the
  traced module's mode (``self.training``, read on every call), so one graph is exact in both
  modes and ``find`` / ``fuse`` / ``replace`` / pipeline cuts see one graph as before;
* different operations (an ``if self.training:`` branch that calls something only in one mode):
  the graph holds the traced mode only and a :func:`check_mode` guard raises
  :class:`TracedModeError` (one line: the module, the mode it was traced in, what to do) when
  it is called in the other mode.

The whole region is flipped to the other mode for the second trace; the modes of the modules
are restored afterwards, so the traced-mode graph is exactly what the module computed.
"""

from __future__ import annotations

import math
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.fx as fx
from torch import nn
from torch.fx.node import has_side_effect

from ..errors import TraceError

__all__ = ["TracedModeError", "by_mode", "check_mode", "merge_modes", "other_mode", "mode_name",
           "trace_in_both_modes", "unchanged_buffers"]

_Literal = (type(None), bool, int, float, str, torch.dtype, torch.device)


class TracedModeError(TraceError):
    """A traced module runs in a mode (training / evaluation) its graph cannot compute."""


def mode_name(training: bool) -> str:
    """``"training"`` or ``"evaluation"``."""
    return "training" if training else "evaluation"


def by_mode(training: bool, if_training: Any, if_eval: Any) -> Any:
    """The value a traced argument has in the module's current mode (a graph node)."""
    return if_training if training else if_eval


@has_side_effect
def check_mode(training: bool, traced: bool, path: str, hint: str) -> None:
    """Guard of a graph whose operations depend on the mode it was traced in."""
    if bool(training) is not traced:
        raise TracedModeError(
            f"'{path or '<root>'}' was traced in {mode_name(traced)} mode and its graph "
            f"computes something else in {mode_name(not traced)} mode",
            hint=hint)


class other_mode:  # a context manager used like a function
    """Inside the block every module of ``mod`` is in the mode opposite to ``mod``'s; each
    module's own mode is restored on exit."""

    def __init__(self, mod: nn.Module):
        self.mod = mod
        self.saved = [(m, m.training) for m in mod.modules()]

    def __enter__(self) -> bool:
        self.mod.train(not self.mod.training)
        return self.mod.training

    def __exit__(self, *exc: Any) -> None:
        for m, training in self.saved:
            m.training = training


class unchanged_buffers:  # a context manager used like a function
    """Buffers of ``mod`` as they were before the block: tracing runs the forward on example
    values, and a training-mode batch norm would count that run in its running statistics."""

    def __init__(self, mod: nn.Module):
        self.saved = [(b, b.clone()) for b in mod.buffers() if not b.is_meta]

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        with torch.no_grad():
            for b, value in self.saved:
                if b.shape == value.shape:
                    b.copy_(value)


def _same_literal(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


class _Diff:
    """Where two graphs traced in the two modes differ."""

    def __init__(self):
        self.literals: List[Tuple[fx.Node, Tuple[Any, ...], Any, Any]] = []
        self.structural: Optional[fx.Node] = None


def _compare_arg(a: Any, b: Any, index: dict, where: Tuple[Any, ...], node: fx.Node,
                 diff: _Diff) -> bool:
    """Whether ``a`` (traced mode) and ``b`` (other mode) are the same up to literal leaves;
    differing literals are recorded in ``diff``."""
    if isinstance(a, fx.Node) or isinstance(b, fx.Node):
        return isinstance(a, fx.Node) and isinstance(b, fx.Node) and index[a] == index[b]
    if isinstance(a, (tuple, list)) and type(a) is type(b):
        return len(a) == len(b) and all(_compare_arg(x, y, index, where + (i,), node, diff)
                                        for i, (x, y) in enumerate(zip(a, b)))
    if isinstance(a, dict) and type(a) is type(b):
        return a.keys() == b.keys() and all(
            _compare_arg(a[k], b[k], index, where + (k,), node, diff) for k in a)
    if isinstance(a, _Literal) and isinstance(b, _Literal):
        if not _same_literal(a, b):
            diff.literals.append((node, where, a, b))
        return True
    if isinstance(a, slice) and isinstance(b, slice):  # bounds may be nodes; literals equal
        inner = _Diff()
        return _compare_arg((a.start, a.stop, a.step), (b.start, b.stop, b.step), index, where,
                            node, inner) and not inner.literals
    return a is b or (type(a) is type(b) and _safe_eq(a, b))


def _safe_eq(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - not comparable: treat as different
        return False


def _pad_defaults(node: fx.Node, n: int) -> None:
    """Positional arguments of an ATen op call up to ``n``, the left-out ones at their schema
    defaults (the same call)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or len(node.args) >= n or n > len(schema.arguments):
        return
    extra = []
    for arg in schema.arguments[len(node.args):n]:
        if arg.kwarg_only or not arg.has_default_value():
            return
        extra.append(arg.default_value)
    node.args = tuple(node.args) + tuple(extra)


def _diff(traced: fx.Graph, other: fx.Graph) -> _Diff:
    diff = _Diff()
    a_nodes, b_nodes = list(traced.nodes), list(other.nodes)
    index = {n: i for i, n in enumerate(a_nodes)}
    index.update({n: i for i, n in enumerate(b_nodes)})
    for a, b in zip(a_nodes, b_nodes):
        if a.op == b.op and a.target == b.target and len(a.args) != len(b.args):
            _pad_defaults(a, len(b.args))  # an ATen op leaves out defaults (dropout_p=0.0)
            _pad_defaults(b, len(a.args))
        same = (a.op == b.op and a.target == b.target
                and _compare_arg(tuple(a.args), tuple(b.args), index, ("args",), a, diff)
                and _compare_arg(dict(a.kwargs), dict(b.kwargs), index, ("kwargs",), a, diff))
        if not same:
            diff.structural = a
            return diff
    if len(a_nodes) != len(b_nodes):
        diff.structural = a_nodes[min(len(a_nodes), len(b_nodes)) - 1]
    return diff


def _replace(value: Any, where: Tuple[Any, ...], new: Any) -> Any:
    if not where:
        return new
    head, rest = where[0], where[1:]
    if isinstance(value, dict):
        out = dict(value)
        out[head] = _replace(value[head], rest, new)
        return out
    items = list(value)
    items[head] = _replace(items[head], rest, new)
    return type(value)(items) if isinstance(value, tuple) and not hasattr(value, "_fields") \
        else (tuple(items) if isinstance(value, tuple) else items)


def _training_node(graph: fx.Graph) -> fx.Node:
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = placeholders[-1] if placeholders else None
    # create_node: Graph.get_attr warns that a bool is not a parameter, buffer or module
    if anchor is None:
        with graph.inserting_before(next(iter(graph.nodes))):
            return graph.create_node("get_attr", "training")
    with graph.inserting_after(anchor):
        return graph.create_node("get_attr", "training")


def _module_of(node: fx.Node, path: str) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    inner = [p for p, _ in stack.values() if p]
    if inner:
        return f"{path}.{inner[-1]}" if path else inner[-1]
    return path or "<root>"


def merge_modes(traced: fx.Graph, other: Optional[fx.Graph], training: bool, path: str,
                guard: bool = True) -> str:
    """Make ``traced`` (traced with the module in mode ``training``) exact in both modes, given
    ``other``, the same region traced in the other mode (see module docstring). Returns
    ``"same"``, ``"merged"`` (mode-dependent literals became :func:`by_mode` nodes) or
    ``"guarded"`` (a :func:`check_mode` guard was added; also when ``other`` is ``None``: the
    region could not be traced in the other mode; with ``guard=False`` the caller guards and the
    graph is left as it is)."""
    if other is None:
        diff = _Diff()
        diff.structural = next(iter(traced.nodes))
    else:
        diff = _diff(traced, other)
    if diff.structural is None and not diff.literals:
        return "same"
    if diff.structural is not None and not guard:
        return "guarded"
    mode = _training_node(traced)
    if diff.structural is not None:
        where = _module_of(diff.structural, path)
        hint = (f"run it in {mode_name(training)} mode, or make '{where}' (whose forward "
                "branches on self.training) a leaf: trace(leaves=[...]) keeps it a module "
                "call that follows the mode")
        if other is None or where == (path or "<root>"):
            hint = (f"its own forward branches on self.training (e.g. LayerDrop), so no one "
                    f"graph computes both modes: run it in {mode_name(training)} mode, or "
                    f"trace it with the model in {mode_name(not training)} mode to run in that")
        with traced.inserting_after(mode):
            traced.call_function(check_mode, (mode, training, path, hint))
        return "guarded"
    for node, where, a, b in diff.literals:
        if_train, if_eval = (a, b) if training else (b, a)
        with traced.inserting_before(node):
            pick = traced.call_function(by_mode, (mode, if_train, if_eval))
        pick.meta["val"] = a
        args, kwargs = node.args, node.kwargs
        if where[0] == "args":
            node.args = _replace(tuple(args), where[1:], pick)
        else:
            node.kwargs = _replace(dict(kwargs), where[1:], pick)
    return "merged"


def trace_in_both_modes(mod: nn.Module, trace: Callable[[], fx.Graph]
                        ) -> Tuple[Optional[fx.Graph], fx.Graph]:
    """``(other_mode_graph, traced_mode_graph)``: ``trace()`` run with ``mod`` flipped to the
    other mode first (its tensor constants set aside; ``None`` where it fails), then in its own
    mode."""
    other: Optional[fx.Graph] = None
    with other_mode(mod):
        try:
            other = trace()
        except TraceError:  # not traceable in the other mode: the traced mode is guarded
            other = None
    constants = [k for k in mod.__dict__ if k.startswith("_tensor_constant")]
    other_constants = {k: mod.__dict__.pop(k) for k in constants}
    traced = trace()
    for k, v in other_constants.items():
        same = k in mod.__dict__ and isinstance(v, torch.Tensor) and \
            isinstance(mod.__dict__[k], torch.Tensor) and v.shape == mod.__dict__[k].shape \
            and torch.equal(v, mod.__dict__[k])
        if not same and other is not None:  # a mode-dependent constant: an operation difference
            for n in other.nodes:
                if n.op == "get_attr" and n.target == k:
                    n.target = k + "_other_mode"
    return other, traced
