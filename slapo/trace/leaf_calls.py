"""Callables the tracer keeps opaque: one ``call_function`` node per call, never traced through.

A module's forward sometimes calls a plain callable attribute rather than a submodule, e.g. a
HuggingFace causal LM's ``self.loss_function(logits=..., labels=...)``. The tracer follows such
calls into their code. That is right for ordinary Python, but wrong for callables that run
collectives through autograd functions (the vocab-parallel loss,
:class:`slapo.op.cross_entropy.VocabParallelCausalLMLoss`): torch.fx cannot record
``dist.all_reduce(x, op=ReduceOp.MAX, group=...)`` (a ``ReduceOp`` or a process group is not a
value a graph can hold) nor run an ``autograd.Function`` on proxies.

A callable whose *class* sets ``_slapo_leaf = True`` (the flag that makes a module a tracing leaf)
is therefore recorded whole: while a module is traced, :func:`leaf_callables` swaps every such
attribute of the traced modules for a :class:`LeafCall`, which, called with traced values,
adds one ``call_function`` node whose target is itself and returns its proxy; the node's example
value is computed by calling the original on the example values. At run time the graph calls the
:class:`LeafCall`, which calls the original. The attributes are put back after tracing.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Tuple

import torch.fx as fx
from torch import nn
from torch.utils._pytree import tree_leaves

__all__ = ["LeafCall", "is_leaf_callable", "leaf_callables"]


def is_leaf_callable(value: Any) -> bool:
    """Whether ``value`` is a callable (not a module) whose class asks to stay opaque to the
    tracer (``_slapo_leaf = True``)."""
    return (callable(value) and not isinstance(value, (nn.Module, type))
            and getattr(type(value), "_slapo_leaf", False) is True)


class LeafCall:
    """``fn`` recorded as one graph node when it is called with traced values (module
    docstring); called with real values, it is ``fn``. ``__name__`` and ``__module__`` name the
    node's target in the generated code."""

    def __init__(self, fn: Any):
        self.fn = fn
        self.__name__ = f"leaf_{type(fn).__name__}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        proxy = next((v for v in tree_leaves((args, kwargs)) if isinstance(v, fx.Proxy)), None)
        if proxy is None:
            return self.fn(*args, **kwargs)
        return proxy.tracer.create_proxy("call_function", self, args, kwargs)

    def __repr__(self) -> str:
        return f"LeafCall({self.fn!r})"


@contextlib.contextmanager
def leaf_callables(root: nn.Module) -> Iterator[None]:
    """While tracing ``root``: every leaf callable attribute (:func:`is_leaf_callable`) of
    ``root`` and its submodules is a :class:`LeafCall`; the originals are restored on exit."""
    swapped: List[Tuple[nn.Module, str, Any]] = []
    try:
        for mod in root.modules():
            for name, value in list(vars(mod).items()):
                if is_leaf_callable(value):
                    swapped.append((mod, name, value))
                    vars(mod)[name] = LeafCall(value)
        yield
    finally:
        for mod, name, value in swapped:
            vars(mod)[name] = value
