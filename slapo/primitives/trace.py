"""``trace`` / ``trace_until``: trace-by-need, one module (and optionally its children) at a time.

Only the module a schedule needs as a graph is traced (for ``find``/``fuse``/subgraph
``replace``/``checkpoint`` or pipeline cuts); everything else stays an ordinary dynamic module.
Inputs never have to be built by hand: they are captured from one forward of the whole model
(``example_inputs`` given once, on any ``trace`` call, and kept at the root) with a forward
pre-hook on the module, or taken from the parent's trace when tracing recursively.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence, Tuple, Type, Union

import torch
import torch.fx as fx
from torch import nn

from ..errors import TraceError
from ..trace.compute_dtype import inputs_as_computed, parameters_as_computed
from ..trace.dynamo import check_tracer, trace_dynamo
from ..trace.example_values import detached
from ..trace.stand_ins import meta_stand_ins
from ..trace.tracer import Inputs, has_wrappers, is_builtin_leaf, trace_module
from .module_checks import format_call
from .registry import Primitive, register_primitive

__all__ = ["Trace", "TraceUntil", "capture_inputs", "as_inputs", "LeafSpec"]

LeafSpec = Sequence[Union[str, Type[nn.Module]]]
_INPUTS_KEY = "example_inputs"  # root metadata: the model inputs used to capture module inputs


class _Captured(Exception):
    """Raised by the capture hook to stop the forward once the module's inputs are known."""


def as_inputs(value: Any) -> Inputs:
    """``(args, kwargs)`` from a tensor, a tuple of args, a dict of kwargs, or the pair."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict) \
            and isinstance(value[0], (tuple, list)):
        return tuple(value[0]), dict(value[1])
    if isinstance(value, dict):
        return (), dict(value)
    if isinstance(value, (tuple, list)):
        return tuple(value), {}
    return (value,), {}


def capture_inputs(root: nn.Module, target: nn.Module, example_inputs: Any, path: str) -> Inputs:
    """The ``(args, kwargs)`` ``target`` receives when ``root`` runs on ``example_inputs``.

    The forward stops right after the capture (nothing after it runs) and the global RNG state
    is left untouched.
    """
    got = []

    def hook(mod, args, kwargs):
        got.append((detached(args), detached(kwargs)))
        raise _Captured

    args, kwargs = as_inputs(inputs_as_computed(example_inputs))
    handle = target.register_forward_pre_hook(hook, with_kwargs=True, prepend=True)
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad(), \
                parameters_as_computed(root), meta_stand_ins(root):
            root(*args, **kwargs)
    except _Captured:
        pass
    finally:
        handle.remove()
    if not got:
        raise TraceError("the module was not called when the model ran on the example inputs",
                         path=path, call="trace()", module=target,
                         hint="trace a module that the forward uses, or pass inputs=(args, "
                         "kwargs) for it explicitly")
    return got[0]


def _resolve_inputs(sch, inputs: Any, example_inputs: Any) -> Inputs:
    """The module's ``(args, kwargs)``, floating-point tensors in the compute dtype of an
    enclosing :func:`~slapo.trace.compute_dtype.compute_dtype` block."""
    args, kwargs = _given_or_captured(sch, inputs, example_inputs)
    return inputs_as_computed(tuple(args)), inputs_as_computed(dict(kwargs))


def _given_or_captured(sch, inputs: Any, example_inputs: Any) -> Inputs:
    root = sch.root
    if example_inputs is not None:
        root.metadata[_INPUTS_KEY] = example_inputs
    if inputs is not None:
        return as_inputs(inputs)
    stored = root.metadata.get(_INPUTS_KEY)
    if stored is None:
        raise TraceError(
            "no inputs to trace with", path=sch.path, call="trace()", module=sch.mod,
            hint="pass example_inputs=<inputs of the whole model> (kept for later traces) or "
            "inputs=(args, kwargs) of this module",
        )
    if sch is root:
        return as_inputs(stored)
    return capture_inputs(root.mod, sch.mod, stored, sch.path)


def _user_leaf(mod: nn.Module, path: str, rel: str, leaves: LeafSpec) -> bool:
    for spec in leaves:
        if isinstance(spec, type) and isinstance(mod, spec):
            return True
        if isinstance(spec, str) and spec in (type(mod).__name__, path, rel):
            return True
    return False


def _real_leaf(mod: nn.Module, path: str, rel: str, leaves: LeafSpec) -> bool:
    """Modules never traced through: PyTorch layers, user leaves, slapo-wrapped modules, and
    modules whose class says so (``_slapo_leaf``, e.g. ``LinearWithSync``, which runs a
    collective)."""
    if getattr(mod, "_slapo_inline", False) and not has_wrappers(mod):
        return False
    return (is_builtin_leaf(mod) or has_wrappers(mod) or getattr(mod, "_slapo_leaf", False)
            or _user_leaf(mod, path, rel, leaves))


def _has_hooks(mod: nn.Module) -> bool:
    return bool(mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks
                or getattr(mod, "_backward_pre_hooks", None))


def _trace_node(sch, inputs: Inputs, leaves: LeafSpec, flatten: bool, recursive: bool,
                until: Optional[Tuple[str, ...]]) -> fx.GraphModule:
    """Trace ``sch.mod`` with ``inputs``, swap the GraphModule in, then recurse into children."""
    mod = sch.mod
    if isinstance(mod, fx.GraphModule):
        return mod

    def join(q: str) -> str:
        return f"{sch.path}.{q}" if sch.path else q

    if flatten:
        def is_leaf(m: nn.Module, q: str) -> bool:
            return _real_leaf(m, join(q), q, leaves) or (_has_hooks(m)
                                                          and not getattr(m, "_slapo_inline",
                                                                          False))
    else:
        def is_leaf(m: nn.Module, q: str) -> bool:
            if m is mod:
                return False
            return not (getattr(m, "_slapo_inline", False) and not has_wrappers(m)
                        and not _has_hooks(m))

    gm, child_inputs = trace_module(mod, inputs, is_leaf, path=sch.path)
    sch.swap_module(gm)
    sch.metadata["trace"] = {"flatten": flatten, "leaves": [getattr(x, "__name__", x)
                                                            for x in leaves]}
    if flatten or not recursive:
        return gm
    for rel, child_in in child_inputs.items():
        path = join(rel)
        child = sch[rel]
        if _real_leaf(child.mod, path, rel, leaves) or isinstance(child.mod, fx.GraphModule):
            continue
        if until is not None and not any(u == path or u.startswith(path + ".") for u in until):
            continue
        if until is not None and path in until:
            _trace_node(child, child_in, leaves, False, False, None)
        else:
            _trace_node(child, child_in, leaves, False, True, until)
    return gm


@register_primitive
class Trace(Primitive):
    name = "trace"
    original_kwargs = {
        "concrete_args": "example_inputs= (inputs of the whole model, kept for later traces) or "
                         "inputs=(args, kwargs) of this module; literal arguments are taken "
                         "from them, fixed and guarded",
        "leaf_modules": "leaves=[...] (module classes, class names or module paths)",
        "config": "drop it: it configured the HF tracer; the default tracer follows HF modules "
                  "without it",
    }

    @staticmethod
    def apply(
        sch,
        inputs: Any = None,
        *,
        example_inputs: Any = None,
        leaves: LeafSpec = (),
        flatten: bool = False,
        recursive: bool = True,
        tracer: str = "fx",
    ) -> fx.GraphModule:
        """Trace this module into an ``fx.GraphModule`` that replaces it in place.

        Inputs: ``example_inputs`` are inputs of the *whole model* (kwargs dict, args tuple or a
        tensor); they are kept at the root, so later ``trace`` calls on other modules need none.
        This module's own inputs are captured by running the model once with a forward
        pre-hook (stopped right after). ``inputs=(args, kwargs)`` gives them directly instead.

        Non-flatten (default): each called child becomes a ``call_module`` node under its
        original name, and with ``recursive=True`` each child that is not a leaf is traced
        into its own GraphModule, so every path (``sch['...attention.self.query']``) stays
        valid. Leaves (never traced through): PyTorch layers (``nn.Linear`` ...),
        transformers' ``Conv1D``, modules with slapo forward wrappers (``checkpoint``,
        ``fork_rng``), and ``leaves`` given by class, class name or path. ``flatten=True``
        inlines every non-leaf child (and modules with hooks stay leaves) into one graph; the
        children stay registered so paths and ``state_dict`` keys do not change.

        The graph is valid for other batch/sequence sizes. It is exact in training *and*
        evaluation mode: the module is traced in both and arguments that differ (dropout
        probabilities) read ``self.training`` on every call; where the operations differ
        (``if self.training:`` in an inlined module) it runs only in the mode it was traced in
        and refuses the other with one line (make that module a leaf to keep both). Whatever
        else the Python code decided at trace time is guarded, and a call for which the
        decision would differ raises one line: literal arguments, control flow on traced
        values, numbers taken from them, grad mode / autocast / the default dtype, the dtype
        and device of every traced value the code read (``x.dtype``), the config attributes
        the code read (``config._attn_implementation``, ``output_attentions``) and module
        flags such as ``gradient_checkpointing``; asking HF for outputs it collects with hooks
        on a module the graph inlined (``output_attentions``) refuses too (see
        :mod:`slapo.trace.baked`). Reads inside leaves follow their current value. Tracing does
        not change the global RNG state.
        Already traced: returns the GraphModule.

        ``tracer="dynamo"`` traces with ``torch.export`` instead, for code the default
        (``"fx"``) cannot follow: one flat ATen graph, same parameter names and state_dict,
        no ``call_module`` nodes (see :mod:`slapo.trace.dynamo`).

        Before: ``sch.mod`` is the module. After: ``sch.mod`` is a ``GraphModule`` callable
        the same way (same parameter names, hooks, state_dict).

        Raises:
            TraceError: no inputs known; the module is not called by the model; a construct
                could not be traced (the message names the source line).
        """
        check_tracer(sch, tracer)
        ins = _resolve_inputs(sch, inputs, example_inputs)
        _check_leaves(sch, leaves)
        if tracer != "fx":
            return trace_dynamo(sch, ins, leaves=leaves, flatten=flatten, recursive=recursive)
        return _trace_node(sch, ins, tuple(leaves), flatten, recursive, None)


@register_primitive
class TraceUntil(Primitive):
    name = "trace_until"
    original_kwargs = Trace.original_kwargs

    @staticmethod
    def apply(
        sch,
        paths: Union[str, Iterable[str]],
        inputs: Any = None,
        *,
        example_inputs: Any = None,
        leaves: LeafSpec = (),
    ) -> fx.GraphModule:
        """Trace this module and the modules on the way down to ``paths`` (full paths).

        Each module on the way is traced non-flatten; each module in ``paths`` is traced with
        its children kept as leaves (so a pipeline cut can be placed on them); everything
        off the way stays an untouched dynamic module. Inputs as in :meth:`trace`.

        Raises:
            TraceError: a path is not below this module, or as in :meth:`trace`.
        """
        targets = (paths,) if isinstance(paths, str) else tuple(paths)
        for p in targets:
            inside = sch.path == "" or p == sch.path or p.startswith(sch.path + ".")
            if not inside or p not in sch.root:
                raise TraceError(f"'{p}' is not a module below '{sch.path or '<root>'}'",
                                 path=sch.path, call=format_call("trace_until", paths),
                                 module=sch.mod, hint=sch.root._suggest(p))
        ins = _resolve_inputs(sch, inputs, example_inputs)
        _check_leaves(sch, leaves)
        if sch.path in targets:
            return _trace_node(sch, ins, tuple(leaves), False, False, None)
        return _trace_node(sch, ins, tuple(leaves), False, True, targets)


def _check_leaves(sch, leaves: LeafSpec) -> None:
    if isinstance(leaves, (str, type)):
        raise TraceError("leaves must be a list", path=sch.path, call="trace()",
                         module=sch.mod, hint=f"write leaves=[{leaves!r}]")
    for spec in leaves:
        if not (isinstance(spec, str) or (isinstance(spec, type)
                                          and issubclass(spec, nn.Module))):
            raise TraceError(f"invalid leaf {spec!r}", path=sch.path, call="trace()",
                             module=sch.mod,
                             hint="give module classes, class names or module paths")
