"""Trace-by-need: turn one module into an ``fx.GraphModule`` that keeps the module hierarchy.

HuggingFace modules defeat plain ``torch.fx.symbolic_trace`` (decorated forwards, ``**kwargs``,
shape unpacking, ``len``/``bool`` on proxies). :class:`ValueTracer` traces with *real example
values* flowing beside the graph: every node gets ``node.meta["val"]`` computed from the values of
its inputs (with fx's patches reverted), so Python-level questions a proxy cannot answer
(``len``, ``iter``, ``bool``, ``keys``, ``.dtype``, ``.device``, ``.ndim``, ``int()``,
``isinstance`` (:mod:`slapo.trace.type_checks`)) are answered from the value and fixed in the
graph (numbers and ``len`` of tensors guarded), while tensor *shapes* stay symbolic
(``x.shape[0]`` is a node), so the graph is valid for other batch and sequence sizes.

``self.training``: the region is traced in both modes and the graphs merged
(:mod:`slapo.trace.modes`): exact in both modes, or refusing the mode it cannot compute.

What is specialised at trace time (documented limits): Python control flow, non-tensor
arguments (``None``, flags, ints), and ``len()`` / ``int()`` of traced values. Specialised
arguments and branches are *guarded* (:mod:`slapo.trace.guards`): calling the traced module
with a different literal value, or with inputs for which a condition on a traced value (``if
(ids == -100).any():``, ``assert torch.all(...)``) would take the other branch, raises
:class:`~slapo.errors.TraceError` instead of silently computing something else. In-place item
assignment (``x[..., 1:] = y``, as in T5's ``_shift_right``) is recorded as
``operator.setitem``.

The traced module is callable exactly like the original: its ``forward`` has the original
parameter names, defaults, ``*args``/``**kwargs``; children, parameters and buffers keep their
names (``state_dict`` keys are unchanged), hooks and slapo forward wrappers move to it, and plain
attributes (``config``, ``layer_idx`` ...) are copied. A callable attribute whose class sets
``_slapo_leaf = True`` (a loss that runs collectives) is one opaque node
(:mod:`slapo.trace.leaf_calls`).
"""

from __future__ import annotations

import inspect
import operator
import traceback
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.fx as fx
from torch import nn
from torch.fx._symbolic_trace import _maybe_revert_all_patches
from torch.fx.node import map_arg
from torch.fx.proxy import Attribute

from ..errors import TraceError
from ..runtime.forward_wrap import forward_wrappers
from .baked import GUARDED_TENSOR_ATTRS, ConfigReads, check_tensor_attr
from .compute_dtype import parameters_as_computed
from .example_values import detached, is_dynamic, is_literal, output_builder
from .graph_module import drop_dead_reads, graph_module, guard_baked_state, guard_global_state
from .guards import (check_branch, check_kwargs, check_number, check_specialized,
                     model_source_site, record_global_reads)
from .leaf_calls import leaf_callables
from .modes import merge_modes, trace_in_both_modes, unchanged_buffers
from .stand_ins import meta_stand_ins
from .type_checks import isinstance_sees_values

__all__ = ["ValueTracer", "trace_module", "Inputs", "is_builtin_leaf"]

Inputs = Tuple[Tuple[Any, ...], Dict[str, Any]]

# Attributes of a tensor value that are specialised to constants, each read guarded (never
# shapes): slapo.trace.baked.
_CONST_ATTRS = frozenset(GUARDED_TENSOR_ATTRS)


def is_builtin_leaf(mod: nn.Module) -> bool:
    """PyTorch's own layers (``nn.Linear`` ...) are leaves; containers are not."""
    if isinstance(mod, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
        return False
    return type(mod).__module__.startswith("torch.nn") or type(mod).__name__ == "Conv1D"


class ValueProxy(fx.Proxy):
    """A proxy that knows the example value of its node (``node.meta['val']``); while tracing,
    ``isinstance`` asks the value (:mod:`slapo.trace.type_checks`)."""

    @property
    def value(self) -> Any:
        return self.node.meta["val"]

    def __getattr__(self, k: str) -> Any:
        if k in _CONST_ATTRS:  # a real dtype / device: fixed in the graph, guarded
            value = getattr(self.value, k)
            self.tracer.guard_attr(self, k, value)
            return value
        return ValueAttribute(self, k)

    def __iter__(self):
        v = self.value
        if isinstance(v, dict):
            return iter(list(v.keys()))
        return iter([self[i] for i in range(len(v))])

    def __len__(self) -> int:
        n = len(self.value)
        if isinstance(self.value, torch.Tensor):  # the batch size, fixed: guarded
            self._guard_number(n, True)
        return n

    def _guard_number(self, n: Any, of_len: bool = False) -> Any:
        self.tracer.create_proxy("call_function", check_number,
                                 (self, n, model_source_site(), of_len), {})
        return n

    def __bool__(self) -> bool:
        taken = bool(self.value)  # control flow: the branch is fixed, and guarded
        self.tracer.create_proxy("call_function", check_branch,
                                 (self, taken, model_source_site()), {})
        return taken

    def __index__(self) -> int:
        return self._guard_number(int(self.value))

    def __int__(self) -> int:
        return self._guard_number(int(self.value))

    def __float__(self) -> float:
        return self._guard_number(float(self.value))

    def keys(self):
        return self.value.keys()

    def __setitem__(self, key: Any, value: Any) -> None:
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})


class ValueAttribute(ValueProxy, Attribute):
    """``proxy.attr``: a node is created only when used; its value is read from the root's."""

    @property
    def value(self) -> Any:
        return getattr(self.root.value, self.attr)


class ValueTracer(fx.Tracer):
    """Traces ``root`` called with example ``inputs`` (see module docstring).

    Args:
        root: the module to trace.
        inputs: ``(args, kwargs)`` as the parent calls it (captured from a real forward).
        is_leaf: ``(module, qualified_name) -> bool`` for submodules of ``root``.
    """

    def __init__(self, root: nn.Module, inputs: Inputs,
                 is_leaf: Callable[[nn.Module, str], bool]):
        super().__init__(param_shapes_constant=False)
        self.proxy_buffer_attributes = True  # `buf[:, :n]` must stay symbolic in n
        self.traced_root = root
        self.example_args, self.example_kwargs = inputs
        self._is_leaf = is_leaf
        self.child_inputs: Dict[str, Inputs] = {}  # leaf path -> inputs of its first call
        self._ph_vals: Dict[str, Any] = {}
        self.global_reads: List[Tuple[str, tuple, Any]] = []  # grad mode, autocast queries
        self.config_reads = ConfigReads(root)  # config flags the model code reads
        self.path = ""
        self._guarded: set = set()  # (node, attribute) pairs with a check_tensor_attr guard

    def guard_attr(self, proxy: fx.Proxy, attr: str, value: Any) -> None:
        """One :func:`~slapo.trace.baked.check_tensor_attr` guard per value and attribute."""
        key = (proxy.node, attr)
        if key not in self._guarded:
            self._guarded.add(key)
            self.create_proxy("call_function", check_tensor_attr,
                              (proxy, attr, value, proxy.node.name, model_source_site(),
                               self.path), {})

    # ------------------------------------------------------------------ fx hooks
    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return self._is_leaf(m, module_qualified_name)

    def call_module(self, m, forward, args, kwargs):
        if m not in self.submodule_paths:  # created inside forward (e.g. a loss): inline it
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return ValueProxy(node, self)

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None,
                     proxy_factory_fn=None):
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr,
                                     proxy_factory_fn)
        node = proxy.node
        if "val" not in node.meta:
            node.meta["val"] = self._evaluate(node)
        return proxy

    def create_arg(self, a: Any) -> Any:
        if isinstance(a, dict) and type(a) is not dict and not isinstance(a, fx.Proxy):
            fields = {k: self.create_arg(v) for k, v in a.items()}
            node = self.create_node("call_function", output_builder(type(a)), (fields,), {})
            node.meta["val"] = a
            return node
        try:
            return super().create_arg(a)
        except NotImplementedError:
            hint = ("pass such objects only to leaf modules, or make the module that creates "
                    "it a leaf (trace(leaves=[...]))")
            if "cache" in type(a).__name__.lower():
                hint = "train without a KV cache: set model.config.use_cache = False"
            raise TraceError(f"the forward creates a {type(a).__name__} object and passes it "
                             "on; such objects cannot be represented in the graph",
                             hint=hint) from None

    # ------------------------------------------------------------------ value propagation
    def _value_of(self, node: fx.Node) -> Any:
        if "val" not in node.meta:  # e.g. get_attr nodes made by create_arg
            node.meta["val"] = self._evaluate(node)
        return node.meta["val"]

    def _evaluate(self, node: fx.Node) -> Any:
        if node.op == "placeholder":
            return self._ph_vals.get(node.target)
        if node.op == "get_attr":
            obj: Any = self.root
            with _maybe_revert_all_patches():
                for atom in node.target.split("."):
                    obj = getattr(obj, atom)
            return obj
        args = map_arg(node.args, self._value_of)
        kwargs = map_arg(node.kwargs, self._value_of)
        # what runs here runs again on every call (leaves read their config then): not recorded
        with _maybe_revert_all_patches(), self.config_reads.pause():
            if node.op == "call_function":
                return node.target(*args, **kwargs)
            if node.op == "call_method":
                return getattr(args[0], node.target)(*args[1:], **kwargs)
            if node.op == "call_module":
                mod = self.root.get_submodule(node.target)
                self.child_inputs.setdefault(node.target, (detached(args), detached(kwargs)))
                return mod(*args, **kwargs)
        return None

    # ------------------------------------------------------------------ root signature
    def create_args_for_root(self, root_fn, is_module, concrete_args=None):
        """Placeholders for every parameter of the original forward (names and defaults
        kept); inputs given as tensors stay symbolic, everything else is specialised and
        guarded."""
        mod = self.traced_root
        sig = inspect.signature(type(mod).forward)
        params = list(sig.parameters.values())[1:]  # drop self
        try:
            bound = sig.bind(mod, *self.example_args, **self.example_kwargs)
        except TypeError as e:
            raise TraceError(f"the inputs do not fit {type(mod).__name__}.forward{sig}: {e}",
                             hint="pass inputs as the parent calls the module") from None
        given = dict(bound.arguments)
        given.pop(next(iter(sig.parameters)))
        P = inspect.Parameter
        call_args: List[Any] = []
        call_kwargs: Dict[str, Any] = {}
        n_positional = len(self.example_args)
        for index, p in enumerate(params):
            if p.kind is P.VAR_POSITIONAL:
                values = given.get(p.name, ())
                ph = self._placeholder("*" + p.name, P.empty, tuple(values))
                call_args.extend(ph[i] if is_dynamic(v) else v for i, v in enumerate(values))
                continue
            if p.kind is P.VAR_KEYWORD:
                values = given.get(p.name, {})
                ph = self._placeholder("**" + p.name, P.empty, dict(values))
                literals = {k: v for k, v in values.items() if is_literal(v)}
                self.create_proxy("call_function", check_kwargs,
                                  (ph, tuple(values), literals), {})
                for k, v in values.items():
                    call_kwargs[k] = ph[k] if is_dynamic(v) else v
                continue
            default = p.default
            if default is not P.empty and not is_literal(default):
                raise TraceError(
                    f"parameter '{p.name}' has a default ({type(default).__name__}) that a "
                    "traced forward cannot reproduce", hint="make the module a leaf")
            value = given.get(p.name, default)
            ph = self._placeholder(p.name, default, value)
            if p.name in given and is_dynamic(value):
                arg = ph
            else:
                arg = value
                if is_literal(value):
                    self.create_proxy("call_function", check_specialized,
                                      (ph, value, p.name), {})
            # Call the original exactly as the parent did: positional stays positional, keywords
            # stay keywords, and what was not passed is not passed (decorators may inject it).
            if index < n_positional:
                call_args.append(arg)
            elif p.name in self.example_kwargs:
                call_kwargs[p.name] = arg
        forward = type(mod).forward

        def run(_self):
            return forward(_self, *call_args, **call_kwargs)

        return run, [self.root]

    def _placeholder(self, target: str, default: Any, value: Any) -> fx.Proxy:
        self._ph_vals[target] = value
        args = () if default is inspect.Parameter.empty else (default,)
        return self.create_proxy("placeholder", target, args, {})


def _failure_site(exc: BaseException) -> str:
    """The model source line where tracing failed (the deepest frame outside torch/slapo)."""
    return model_source_site(traceback.extract_tb(exc.__traceback__))


def trace_module(
    mod: nn.Module,
    inputs: Inputs,
    is_leaf: Callable[[nn.Module, str], bool],
    *,
    path: str = "",
) -> Tuple[fx.GraphModule, Dict[str, Inputs]]:
    """Trace ``mod`` called with ``inputs``; return the GraphModule and the inputs each called
    submodule (leaf) received, by qualified name.

    Raises:
        TraceError: naming the construct (source line) that could not be traced.
    """
    tracers: List[ValueTracer] = []

    def trace_once() -> fx.Graph:
        # a fresh copy of stateful inputs (a KV cache grows when the forward runs) per trace
        tracers.append(ValueTracer(mod, (detached(inputs[0]), detached(inputs[1])), is_leaf))
        tracers[-1].path = path
        return _trace_graph(tracers[-1], mod, path)

    other, graph = trace_in_both_modes(mod, trace_once)
    merge_modes(graph, other, mod.training, path)
    guard_global_state(graph, tracers[-1].global_reads, path)
    with guard_baked_state(mod, graph, tracers[-1].config_reads, path) as bind:
        gm = graph_module(mod, graph)
        bind(gm)
    return gm, tracers[-1].child_inputs


def _trace_graph(tracer: "ValueTracer", mod: nn.Module, path: str) -> fx.Graph:
    """One trace of ``mod`` (the global RNG state is left as it was)."""
    state = torch.random.get_rng_state()
    try:
        with torch.random.fork_rng(devices=[]), unchanged_buffers(mod), \
                parameters_as_computed(mod), meta_stand_ins(mod), \
                isinstance_sees_values(ValueProxy), leaf_callables(mod), \
                record_global_reads(tracer.global_reads), tracer.config_reads:
            graph = tracer.trace(mod)
    except TraceError as e:
        e.path = path
        raise TraceError(e.what, path=path, module=mod, hint=e.hint) from None
    except Exception as e:
        raise TraceError(
            f"tracing failed at {_failure_site(e)}: {type(e).__name__}: {e}",
            path=path, call="trace()", module=mod,
            hint="make the submodule containing this construct a leaf (trace(leaves=[...])), "
            "or replace it with a traceable module first",
        ) from e
    finally:
        torch.random.set_rng_state(state)
    drop_dead_reads(graph)
    for node in graph.nodes:  # a node named `self` would shadow the forward's `self`
        if node.name == "self":
            node._rename("self_out")
    return graph


def has_wrappers(mod: nn.Module) -> bool:
    """Modules whose forward is wrapped by slapo (checkpoint, fork_rng) are always leaves."""
    return bool(forward_wrappers(mod))
