"""``trace(tracer="dynamo")``: one flat ATen graph from ``torch.export``, for modules the default
tracer cannot follow.

The default tracer (:mod:`slapo.trace.tracer`) keeps the module hierarchy: every child stays a
``call_module`` node with its own schedule path. It runs the forward on proxies, so Python that
inspects values beyond what it answers from example values (``type(h) is torch.Tensor``, a
custom ``autograd.Function``, library code that branches on tensor types) can trace into the
wrong graph or not at all. ``torch.export`` runs the forward on fake tensors instead and records
every operation as an ATen op (``aten.linear``, ``aten.gelu`` ...): it follows such code, at the
price of a *flat* graph.

What that means for a schedule:

* The traced module's parameters and buffers keep their names and objects (``state_dict`` keys
  do not change), but its children become plain attribute holders: there are no ``call_module``
  nodes, so ``find`` with a module-name regex refuses; ``node.meta["nn_module_stack"]`` still
  names the module each node came from: ``find(where=from_module("fc1"))``. Pattern functions
  match (a pattern's ``F.gelu`` / ``x + y`` / ``F.linear`` match ``aten.gelu`` / ``aten.add`` /
  ``aten.linear``), and a pattern's ``call_module(regex, x)`` matches the operations one call
  of a module whose path matches ran (:func:`module_call`), so one pattern serves both tracers;
  ``fuse``, subgraph ``replace`` and ``checkpoint`` work on the matches.
* Hooks and slapo forward wrappers inside the module (``sync``, ``checkpoint``, ``fork_rng``)
  cannot survive a flat graph, so tracing refuses them: trace first, then apply those.
* Tensor inputs are exported with automatic dynamic shapes (other batch and sequence sizes
  work where the code allows); non-tensor inputs and control flow are fixed at trace time.
* dtypes, devices, config flags and ``gradient_checkpointing``: ``torch.export`` fixes the
  dtypes and devices of the inputs, parameters and buffers (casts, factory calls) and the
  Python decisions on config attributes; a :class:`BakedInputs` pre-hook checks them on every
  call and refuses a change with one line (:mod:`slapo.trace.baked`).
* The module is exported in both modes (:mod:`slapo.trace.modes`): arguments that differ
  (``dropout_p`` of attention) read ``self.training`` on every call, so the graph is exact in
  both modes; where the operations differ (``aten.dropout`` only in training mode) the graph
  runs only in the mode it was traced in and refuses the other (:class:`TracedMode`).
"""

from __future__ import annotations

import contextlib
import inspect
import re
from typing import Any, List, Optional

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from ..errors import TraceError
from ..runtime.forward_wrap import forward_wrappers
from .baked import BakedState, ConfigReads
from .compute_dtype import active_compute_dtype
from .modes import TracedModeError, merge_modes, other_mode, unchanged_buffers
from .original import keep_original

__all__ = ["export_module", "trace_dynamo", "check_tracer", "is_dynamo_graph", "from_module",
           "module_call", "module_region", "module_paths", "TracedMode", "TRACER", "TRACERS"]

TRACER = "dynamo"
_META_KEY = "slapo_tracer"


def is_dynamo_graph(gm: nn.Module) -> bool:
    """Whether ``gm`` was traced with ``tracer="dynamo"`` (a flat ATen graph)."""
    return isinstance(gm, fx.GraphModule) and gm.meta.get(_META_KEY) == TRACER


def _hooked(mod: nn.Module) -> List[str]:
    out = []
    for name, m in mod.named_modules():
        if (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or getattr(m, "_backward_pre_hooks", None) or forward_wrappers(m)):
            out.append(name or "<the module itself>")
    return out


def _dynamic_shapes(mod: nn.Module, args: tuple, kwargs: dict) -> Any:
    """Every axis of every tensor input marked ``Dim.AUTO``, keyed by forward parameter name."""
    def dims(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return {i: torch.export.Dim.AUTO for i in range(v.dim())}
        return None

    def spec(value: Any) -> Any:
        return pytree.tree_map(dims, value, is_leaf=lambda v: v is None)

    try:
        bound = inspect.signature(mod.forward).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None  # static shapes: still correct for the traced sizes
    return {name: spec(value) for name, value in bound.arguments.items()}


def _without_none_extras(mod: nn.Module, kwargs: dict) -> dict:
    """``kwargs`` without the ``None`` values that only ``**kwargs`` of ``forward`` would take.

    torch.export lays such extras out flat in one place and nested in another, so dynamic
    shapes fail to line up ("Must provide a tree_name"); code that takes ``**kwargs`` reads
    them with ``kwargs.get(name)``, for which an absent name and ``None`` are the same."""
    try:
        params = inspect.signature(mod.forward).parameters
    except (TypeError, ValueError):
        return kwargs
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params or v is not None}


class TracedMode:
    """Forward pre-hook of a dynamo graph whose operations differ between training and
    evaluation mode (dropout, batch norm, ``if self.training:``): the graph computes the mode it
    was traced in, so running it in the other mode is an error, not a silently wrong result."""

    def __init__(self, training: bool, path: str):
        self.training, self.path = training, path

    def __call__(self, module: nn.Module, args: tuple) -> None:
        if module.training != self.training:
            traced, now = (("train", "eval") if self.training else ("eval", "train"))
            raise TracedModeError(
                f"this dynamo graph was traced in {traced} mode and its operations differ in "
                f"{now} mode, but it runs in {now} mode", path=self.path,
                call="trace(tracer='dynamo')",
                hint=f"call trace(tracer='dynamo') with the model in {now} mode, or use the "
                "default tracer, which keeps mode-dependent modules as module calls")


class DroppedExtras:
    """Forward pre-hook of a dynamo graph traced without ``None`` extras of ``**kwargs`` (see
    :func:`_without_none_extras`): drops them from later calls too (the exported graph accepts
    exactly the keywords it was traced with), and refuses a value other than ``None``."""

    def __init__(self, names: List[str], path: str):
        self.names, self.path = names, path

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple:
        given = [k for k in self.names if kwargs.get(k) is not None]
        if given:
            raise TraceError(
                f"keyword(s) {', '.join(given)} were None when this dynamo graph was traced "
                "and the graph does not take them", path=self.path,
                call="trace(tracer='dynamo')",
                hint="trace with example inputs that pass them, or use the default tracer")
        return args, {k: v for k, v in kwargs.items() if k not in self.names}


def _tensor_leaves(args: tuple, kwargs: dict) -> list:
    """``(key path, tensor)`` of the tensors in a call's inputs, keywords in name order."""
    flat, _ = pytree.tree_flatten_with_path((tuple(args), {k: kwargs[k] for k in sorted(kwargs)}))
    return [(p, v) for p, v in flat if isinstance(v, torch.Tensor)]


def _input_name(mod: nn.Module, key_path: tuple) -> str:
    """``hidden_states`` / ``position_embeddings[0]`` for a key path of :func:`_tensor_leaves`."""
    try:
        names = [n for n in inspect.signature(mod.forward).parameters]
    except (TypeError, ValueError):
        names = []
    head, rest = key_path[0].idx, key_path[2:]
    key = key_path[1]
    name = key.key if head == 1 else (names[key.idx] if key.idx < len(names) else f"#{key.idx}")
    return str(name) + pytree.keystr(rest)


class BakedInputs:
    """Forward pre-hook of a dynamo graph: the dtypes and devices of its tensor inputs,
    parameters and buffers, and the config attributes and module flags the model code read
    (:class:`~slapo.trace.baked.BakedState`), are what they were when it was exported; the
    graph fixed all of them."""

    def __init__(self, mod: nn.Module, gm: nn.Module, args: tuple, kwargs: dict,
                 state: BakedState, path: str):
        self.inputs = [(_input_name(mod, p), t.dtype, t.device)
                       for p, t in _tensor_leaves(args, kwargs)]
        self.tensors = [(m, table, k, t.dtype, t.device) for m in gm.modules()
                        for table in ("_parameters", "_buffers")
                        for k, t in getattr(m, table).items() if t is not None]
        self.state, self.path = state, path

    def _refuse(self, what: str, dtype: Any, device: Any, t: torch.Tensor) -> None:
        raise TraceError(
            f"was exported with {what} of {dtype} on {device} but it is {t.dtype} on "
            f"{t.device} now; the dynamo graph fixed dtypes and devices",
            path=self.path, call="trace(tracer='dynamo')",
            hint="trace with example inputs and weights of the dtype and device you run with "
            "(model.to(...) before trace())")

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.state.check(self.path)  # first: a config change also changes the inputs' dtypes
        for (name, dtype, device), (_, t) in zip(self.inputs, _tensor_leaves(args, kwargs)):
            if t.dtype != dtype or t.device != device:
                self._refuse(f"input {name}", dtype, device, t)
        for m, table, k, dtype, device in self.tensors:
            t = getattr(m, table)[k]
            if t.dtype != dtype or t.device != device:
                self._refuse(f"tensor {k}", dtype, device, t)


def _export(mod: nn.Module, args: tuple, kwargs: dict, path: str,
            reads: Optional[ConfigReads] = None) -> fx.GraphModule:
    """``torch.export`` of ``mod`` in its current mode, as a GraphModule (the config
    attributes the model code reads recorded in ``reads``)."""
    try:
        with torch.random.fork_rng(devices=[]), unchanged_buffers(mod), \
                (reads if reads is not None else contextlib.nullcontext()):
            program = torch.export.export(mod, args, kwargs,
                                          dynamic_shapes=_dynamic_shapes(mod, args, kwargs),
                                          strict=False)
    except Exception as e:  # torch.export reports many error types
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise TraceError(
            f"torch.export could not trace the module: {type(e).__name__}: {first}",
            path=path, call="trace(tracer='dynamo')", module=mod,
            hint="use the default tracer (drop tracer=), or replace the construct torch.export "
            "rejects (data-dependent control flow needs torch.cond)") from e
    return program.module()


def export_module(mod: nn.Module, inputs: Any, *, path: str = "") -> fx.GraphModule:
    """A flat GraphModule of ``mod`` called with ``inputs = (args, kwargs)`` (``torch.export``).

    The result holds ``mod``'s parameters and buffers (same objects, same names) and runs in
    ``mod``'s training mode.

    Raises:
        TraceError: hooks or forward wrappers inside ``mod``; ``torch.export`` failed (the
            message carries its first line).
    """
    hooked = _hooked(mod)
    if hooked:
        raise TraceError(
            f"{', '.join(hooked[:4])} carr{'ies' if len(hooked) == 1 else 'y'} hooks or slapo "
            "forward wrappers (sync, checkpoint, fork_rng); a flat dynamo graph has no module "
            "calls to keep them on, so they would be baked in once or lost",
            path=path, call="trace(tracer='dynamo')", module=mod,
            hint="trace with tracer='dynamo' before applying those primitives, or use the "
            "default tracer, which keeps them")
    args, kwargs = inputs
    args, given = tuple(args), dict(kwargs)
    kwargs = _without_none_extras(mod, given)
    with other_mode(mod):
        try:
            other: Optional[fx.Graph] = _export(mod, args, kwargs, path).graph
        except TraceError:  # not exportable in the other mode: the traced mode is guarded
            other = None
    reads = ConfigReads(mod)
    gm = _export(mod, args, kwargs, path, reads)
    for name in ("train", "eval"):  # torch.export's module refuses both; the parent calls them
        gm.__dict__.pop(name, None)
    gm.training = mod.training
    if len(kwargs) < len(given):
        gm.register_forward_pre_hook(DroppedExtras(sorted(set(given) - set(kwargs)), path),
                                     with_kwargs=True, prepend=True)
    # a flat graph: every module's code is inlined; the flags it read live on the graph module
    state = BakedState.of(reads, mod, list(mod.named_modules()))
    state.flags = list({f: (None, "", f, v) for _, _, f, v in state.flags}.values())
    state.bind_root(gm)
    gm.register_forward_pre_hook(BakedInputs(mod, gm, args, kwargs, state, path), with_kwargs=True)
    merged = merge_modes(gm.graph, other, mod.training, path, guard=False)
    if merged == "guarded":
        gm.register_forward_pre_hook(TracedMode(mod.training, path))
    elif merged == "merged":
        gm.recompile()
    gm.meta[_META_KEY] = TRACER
    keep_original(mod, gm)  # initialisers that dispatch on the class still find it
    return gm


_OTHER_TRACERS = {
    "pytorch": "tracer='fx' (the default: torch.fx, keeping the module hierarchy); drop tracer=",
    "huggingface": "drop tracer=: the default tracer follows HF modules itself (transformers 5 "
                   "has no HF tracer); use tracer='dynamo' for code it cannot follow",
}
TRACERS = ("fx", TRACER)


def check_tracer(sch, tracer: Any) -> None:
    """Raise TraceError for a ``tracer=`` other than ``"fx"`` and ``"dynamo"``."""
    if tracer in TRACERS:
        return
    hint = _OTHER_TRACERS.get(tracer, "use tracer='fx' (the default) or tracer='dynamo'")
    raise TraceError(f"unknown tracer {tracer!r}", path=sch.path,
                     call=f"trace(tracer={tracer!r})", module=sch.mod, hint=hint)


def trace_dynamo(sch, inputs: Any, *, leaves: Any, flatten: bool, recursive: bool
                 ) -> fx.GraphModule:
    """``sch.trace(tracer="dynamo")``: export ``sch.mod`` and put the graph in its place."""
    if isinstance(sch.mod, fx.GraphModule):
        return sch.mod
    if leaves or flatten or not recursive:
        raise TraceError("leaves=, flatten= and recursive= are options of the default tracer",
                         path=sch.path, call="trace(tracer='dynamo')", module=sch.mod,
                         hint="drop them: a dynamo graph is always flat, without leaves")
    dtype = active_compute_dtype()
    if dtype is not None and any(p.is_floating_point() and p.dtype != dtype
                                 for p in sch.mod.parameters()):
        raise TraceError(f"the dynamo tracer cannot trace for the compute dtype {dtype} "
                         "(slapo.compute_dtype): its graph would hold the parameters' dtype",
                         path=sch.path, call="trace(tracer='dynamo')", module=sch.mod,
                         hint="use the default tracer (tracer='fx'), or cast the model to "
                         "the dtype before tracing")
    gm = export_module(sch.mod, inputs, path=sch.path)
    sch.swap_module(gm)
    sch.metadata["trace"] = {"tracer": TRACER, "flatten": True, "leaves": []}
    return gm


class from_module:  # used like a function: find(where=from_module("fc1"))
    """``find(where=from_module(regex))`` on a dynamo graph: the operations that module
    ``regex`` (``re.match`` on its path relative to the traced module) ran, by
    ``node.meta["nn_module_stack"]`` (a flat graph has no ``call_module`` nodes to match)."""

    def __init__(self, regex: str):
        self.regex = regex
        self.__qualname__ = f"from_module({regex!r})"

    def __call__(self, node: fx.Node) -> bool:
        stack = node.meta.get("nn_module_stack") or {}
        if node.op != "call_function" or not stack:
            return False
        path = list(stack.values())[-1][0]
        return re.match(self.regex, path) is not None

    def __repr__(self) -> str:
        return f"from_module({self.regex!r})"


_NO_MODULE = "_empty_nn_module_stack_from_metadata_hook"  # torch.export's mark for "no module"


def _stack(node: fx.Node) -> dict:
    return node.meta.get("nn_module_stack") or {}


def _names(path: str) -> tuple:
    """A module path relative to the traced module, and the original Slapo's dynamo name of
    it (``self_`` + the path with ``_`` for ``.``: ``self_query``)."""
    return path, "self_" + path.replace(".", "_")


def module_paths(gm: fx.GraphModule) -> List[str]:
    """Paths of the modules that ran in a dynamo graph (``nn_module_stack``), in graph order."""
    out: List[str] = []
    for node in gm.graph.nodes:
        for key, (path, _) in _stack(node).items():
            if path and key != _NO_MODULE and path not in out:
                out.append(path)
    return out


def module_call(node: fx.Node, regex: str) -> Any:
    """The ``nn_module_stack`` key of the innermost module call whose path ``regex`` matches
    (``re.fullmatch`` on the path relative to the traced module, or on the original's
    ``self_``-name) and whose result ``node`` is (no user of ``node`` is inside that call);
    ``None`` when there is none."""
    if node.op != "call_function":
        return None
    for key, (path, _) in reversed(list(_stack(node).items())):
        if path and key != _NO_MODULE and any(re.fullmatch(regex, n) for n in _names(path)):
            if any(key in _stack(u) for u in node.users):
                return None  # an intermediate value of the call, not its result
            return key
    return None


def module_region(node: fx.Node, key: Any) -> tuple:
    """``(nodes, inputs)`` of the module call ``key`` that produced ``node``: the operations of
    that call ``node`` depends on plus the parameters only they read (graph order), and the
    values from outside (first use order, parameters excluded)."""
    inside, todo = {node}, [node]
    while todo:
        for arg in todo.pop().all_input_nodes:
            if arg not in inside and key in _stack(arg):
                inside.add(arg)
                todo.append(arg)
    for n in list(inside):
        for arg in n.all_input_nodes:
            if arg.op == "get_attr" and all(u in inside for u in arg.users):
                inside.add(arg)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    nodes = sorted(inside, key=order.get)
    inputs: List[fx.Node] = []
    for n in nodes:
        for arg in n.all_input_nodes:
            if arg not in inside and arg.op != "get_attr" and arg not in inputs:
                inputs.append(arg)
    return nodes, inputs
