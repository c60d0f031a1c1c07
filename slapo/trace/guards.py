"""Guards of a traced graph: what tracing specialised is checked again on every call.

:class:`~slapo.trace.tracer.ValueTracer` answers Python-level questions from example values and
fixes the answers in the graph. Where the answer could differ for other inputs, it records a guard
node (``has_side_effect``: never removed as dead code) so a call that would have taken another
path raises :class:`~slapo.errors.TraceError` instead of silently computing something else:

* :func:`check_specialized` / :func:`check_kwargs`: arguments that were literals (``None``,
  flags, numbers) when traced, and the keys of ``**kwargs``;
* :func:`check_branch`: ``bool()`` of a traced value, i.e. Python control flow on data or
  shapes (``if (labels == -100).any():``, ``assert torch.all(ids >= 0)``, ``if seq > n:``).
  The condition itself stays in the graph, the branch taken at trace time is fixed, and the
  guard re-evaluates the condition on every call. (Data-dependent conditions cost what they
  cost in eager mode: a device synchronisation.)
* :func:`check_number`: a traced value turned into a Python number (``len(x)``, ``int(n)``,
  ``__index__``): a batch or sequence size fixed in the graph is checked on every call;
* :func:`check_global_state`: grad mode, inference mode, autocast and the default dtype as the
  model code read them while tracing (``torch.is_autocast_enabled()`` in GPT-Neo's attention);
* dtypes, devices and config flags: :mod:`slapo.trace.baked`.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, Dict, Optional, Tuple

import torch
from torch.fx.node import has_side_effect

from ..errors import TraceError

__all__ = ["check_specialized", "check_kwargs", "check_branch", "check_number",
           "record_global_reads", "check_global_state", "model_source_site"]

_RETRACE = "re-trace with inputs like the ones you run"


@has_side_effect
def check_specialized(value: Any, expected: Any, name: str) -> None:
    """Guard inserted for an argument that was a literal at trace time."""
    if value is not expected and not (type(value) is type(expected) and value == expected):
        raise TraceError(
            f"argument '{name}' was {expected!r} when the module was traced but is {value!r} now",
            hint=f"the traced graph specialised it; {_RETRACE}",
        )


@has_side_effect
def check_kwargs(kwargs: Dict[str, Any], keys: Tuple[str, ...], literals: Dict[str, Any]) -> None:
    """Guard for ``**kwargs``: no keys beyond the traced ones; literal values as traced."""
    extra = sorted(set(kwargs) - set(keys))
    if extra:
        raise TraceError(f"keyword argument(s) {', '.join(extra)} were not given when the "
                         "module was traced", hint=_RETRACE)
    for k, v in literals.items():
        check_specialized(kwargs.get(k, None), v, k)


@has_side_effect
def check_branch(condition: Any, taken: bool, site: str) -> None:
    """Guard for Python control flow on a traced value: ``bool(condition)`` must be ``taken``,
    the branch the graph was traced through."""
    if bool(condition) is not taken:
        raise TraceError(
            f"the condition at {site} was {taken} when the module was traced but is "
            f"{not taken} for these inputs; the traced graph only holds the {taken} branch",
            hint=f"{_RETRACE}, or make the module holding this condition a leaf "
            "(trace(leaves=[...]))")


@has_side_effect
def check_number(value: Any, expected: Any, site: str, of_len: bool = False) -> None:
    """Guard for a traced value turned into a Python number (``int(x.shape[1])``, ``len(x)``
    when ``of_len``, ``x[:n]`` with ``n`` traced): the number is fixed in the graph, so it must
    not change."""
    got = len(value) if of_len else type(expected)(value)
    if got != expected:
        raise TraceError(
            f"the number at {site} was {expected} when the module was traced but is {got} for "
            "these inputs; the traced graph fixed it", hint=f"{_RETRACE}, or make the module "
            "computing it a leaf (trace(leaves=[...]))")


_GLOBAL_STATE = ("is_grad_enabled", "is_inference_mode_enabled", "is_autocast_enabled",
                 "get_autocast_dtype", "get_autocast_gpu_dtype", "get_default_dtype")


class record_global_reads:  # a context manager used like a function
    """Inside the block, calls of ``torch.is_grad_enabled``, ``torch.is_inference_mode_enabled``,
    ``torch.get_default_dtype`` and the autocast queries *from model code* (not torch's or
    slapo's own) are appended to ``sink`` as ``(name, args, value)``: the traced graph fixes
    what they answered."""

    def __init__(self, sink: list):
        self.sink = sink
        self.saved: Dict[str, Any] = {}

    def _recording(self, name: str, fn: Any) -> Any:
        def read(*args: Any) -> Any:
            value = fn(*args)
            caller = sys._getframe(1).f_code.co_filename.replace("\\", "/")
            if "/torch/" not in caller and not caller.startswith(_SLAPO_PACKAGE):
                entry = (name, tuple(args), value)
                if entry not in self.sink:
                    self.sink.append(entry)
            return value
        return read

    def __enter__(self) -> None:
        for name in _GLOBAL_STATE:
            fn = getattr(torch, name, None)
            if fn is not None:
                self.saved[name] = fn
                setattr(torch, name, self._recording(name, fn))

    def __exit__(self, *exc: Any) -> None:
        for name, fn in self.saved.items():
            setattr(torch, name, fn)


@has_side_effect
def check_global_state(reads: Tuple[Tuple[str, tuple, Any], ...], path: str) -> None:
    """Guard for grad mode, inference mode, autocast and the default dtype as the model code
    read them when the module was traced (:class:`record_global_reads`)."""
    for name, args, value in reads:
        now = getattr(torch, name)(*args)
        if now != value:
            call = f"torch.{name}({', '.join(map(repr, args))})"
            raise TraceError(
                f"'{path or '<root>'}' read {call} = {value!r} when it was traced but it is "
                f"{now!r} now; the traced graph fixed the answer",
                hint="trace under the grad mode / autocast / default dtype you run in, or make "
                "the module that reads it a leaf (trace(leaves=[...]))")


_TRACE_PACKAGE = os.path.dirname(os.path.abspath(__file__)).replace("\\", "/") + "/"
_SLAPO_PACKAGE = os.path.dirname(_TRACE_PACKAGE.rstrip("/")) + "/"


def model_source_site(frames: Optional[traceback.StackSummary] = None) -> str:
    """``file.py:line `code``` of the deepest frame outside torch and this package (the model
    source line being traced); ``frames`` default: the current stack."""
    frames = frames if frames is not None else traceback.extract_stack()
    for fr in reversed(frames):
        f = fr.filename.replace("\\", "/")
        if "/torch/" not in f and not f.startswith(_TRACE_PACKAGE):
            return f"{f.rsplit('/', 1)[-1]}:{fr.lineno} `{(fr.line or '').strip()}`"
    return "?"
