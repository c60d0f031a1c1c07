"""Example values of a trace: which inputs stay symbolic, detached copies kept for later
traces, and the graph-callables that rebuild dict-like outputs.

:class:`~slapo.trace.tracer.ValueTracer` runs real example values beside the graph. An input
that is a literal (``None``, a flag, a number, a string, or tuples/lists of them) is fixed in
the graph and guarded; anything else (tensors, tuples of tensors, stateful objects such as KV
caches) stays an input (:func:`is_dynamic`). The inputs each called child receives are kept
(:func:`detached`) so that the child can be traced later without running the model again.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Callable, Dict

import torch
from torch import nn
from torch.fx.immutable_collections import immutable_dict

__all__ = ["output_builder", "is_dynamic", "is_literal", "detached"]

_LITERALS = (type(None), bool, int, float, str)


@functools.lru_cache(maxsize=None)
def output_builder(cls: type) -> Callable:
    """A graph-callable that rebuilds a dict-like output (e.g. a HF ``ModelOutput``); one per
    class, so traces in the two modes call the same function. Marked
    ``_slapo_output_builder`` (pipeline cuts see through it to the fields)."""

    def build(fields: Dict[str, Any]) -> Any:
        return cls(**fields)

    build.__name__ = f"make_{cls.__name__}"
    build.__qualname__ = build.__name__
    build._slapo_output_builder = True  # type: ignore[attr-defined]
    return build


def is_dynamic(value: Any) -> bool:
    """Whether an input is kept symbolic: anything but literals (``None``, flags, numbers,
    strings) and modules, so tensors, tuples of tensors and stateful objects such as KV caches
    (whose method calls are recorded) all stay inputs of the graph."""
    return not is_literal(value) and not isinstance(value, nn.Module)


def is_literal(value: Any) -> bool:
    """``None``, a flag, a number, a string, or a tuple/list of them."""
    if isinstance(value, (tuple, list)):
        return all(is_literal(v) for v in value)
    return isinstance(value, _LITERALS)


def detached(value: Any) -> Any:
    """Example values kept for later tracing of children: detached, same requires_grad."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        return t.requires_grad_(value.requires_grad) if t.is_floating_point() else t
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(detached(v) for v in value)
    if isinstance(value, list):  # incl. fx's immutable_list
        return [detached(v) for v in value]
    if type(value) in (dict, immutable_dict):
        return {k: detached(v) for k, v in value.items()}
    if is_literal(value) or isinstance(value, nn.Module) or callable(value):
        return value
    try:  # stateful objects (KV caches) change when the forward goes on: keep a snapshot
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - not copyable: keep the object itself
        return value
