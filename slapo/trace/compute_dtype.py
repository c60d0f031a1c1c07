"""Tracing for a mixed-precision runtime: the model as the runtime will compute it.

A trace fixes the dtypes the model code reads (``input_dtype = hidden_states.dtype`` then
``.to(input_dtype)`` in LLaMA's RMSNorm, ``torch.finfo(x.dtype).min`` in HF's masks) and guards
each read (:mod:`slapo.trace.baked`). Runtimes that keep fp32 master weights and compute in a
lower precision (FSDP2's ``MixedPrecisionPolicy``, DeepSpeed's bf16/fp16 engine) are given the
fp32 model and make the low-precision copies themselves, after the schedule: a module traced in
fp32 then meets bf16 values, its guards refuse, and casting the model before tracing would round
the fp32 masters.

Inside :func:`compute_dtype`, traces (and the forward that captures a module's inputs) see the
model as such a runtime computes it: floating-point *parameters* and floating-point inputs in
the given dtype, buffers as they are (both runtimes cast parameters only). The parameters are
swapped for cast copies for the duration of the trace; the traced graph keeps the original
(fp32) parameters. Its dtype reads hold the compute dtype and stay guarded, so the traced
module runs under the runtime and refuses a run in fp32 with one line: nothing runs on a
stale dtype.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn

from ..errors import TraceError

__all__ = ["compute_dtype", "active_compute_dtype", "parameters_as_computed",
           "inputs_as_computed"]

_ACTIVE: contextvars.ContextVar[Optional[torch.dtype]] = contextvars.ContextVar(
    "slapo_compute_dtype", default=None)


@contextlib.contextmanager
def compute_dtype(dtype: Optional[torch.dtype]) -> Iterator[None]:
    """Trace for a runtime that computes in ``dtype`` while keeping the model's fp32 weights
    (FSDP2 ``MixedPrecisionPolicy(param_dtype=dtype)``, DeepSpeed ``bf16``/``fp16``): inside
    the block, ``trace``/``trace_until`` see floating-point parameters and inputs in ``dtype``
    (see module docstring). ``None`` or ``torch.float32``-for-an-fp32-model change nothing.

    Example::

        with slapo.compute_dtype(torch.bfloat16):
            sch["model.layers.0"].trace(example_inputs=batch)
        model, opt = slapo.build(sch, target="fsdp", mixed_precision=torch.bfloat16)

    Raises:
        TraceError: ``dtype`` is not a floating-point ``torch.dtype``.
    """
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TraceError(f"compute_dtype({dtype!r}): not a floating-point torch dtype",
                         call="slapo.compute_dtype",
                         hint="pass torch.bfloat16, torch.float16 or torch.float32")
    token = _ACTIVE.set(dtype)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_compute_dtype() -> Optional[torch.dtype]:
    """The dtype of the innermost :func:`compute_dtype` block, or None."""
    return _ACTIVE.get()


@contextlib.contextmanager
def parameters_as_computed(model: nn.Module) -> Iterator[None]:
    """Inside the block, the floating-point parameters of ``model`` in another dtype than the
    active compute dtype are cast copies (same ``requires_grad``; ties stay ties); the originals
    are put back on exit. A no-op outside :func:`compute_dtype`."""
    dtype = active_compute_dtype()
    if dtype is None:
        yield
        return
    made: Dict[int, nn.Parameter] = {}
    swapped: List[Tuple[Dict[str, Any], str, nn.Parameter]] = []
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is None or not p.is_floating_point() or p.dtype == dtype:
                continue
            if id(p) not in made:
                made[id(p)] = nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
            swapped.append((mod._parameters, name, p))
            mod._parameters[name] = made[id(p)]
    try:
        yield
    finally:
        for table, name, p in swapped:
            table[name] = p


def inputs_as_computed(value: Any) -> Any:
    """``value`` (a tensor or nested tuples, lists and dicts of them) with its floating-point
    tensors in the active compute dtype, as the runtime casts forward inputs; unchanged outside
    :func:`compute_dtype`."""
    dtype = active_compute_dtype()
    if dtype is None:
        return value
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point() or value.dtype == dtype:
            return value
        return value.detach().to(dtype).requires_grad_(value.requires_grad)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(inputs_as_computed(v) for v in value)
    if isinstance(value, list):
        return [inputs_as_computed(v) for v in value]
    if type(value) is dict:
        return {k: inputs_as_computed(v) for k, v in value.items()}
    return value
