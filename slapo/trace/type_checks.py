"""``isinstance`` on traced values answers as it would for the values themselves.

The default tracer runs the model's Python on proxies. A proxy is not a tensor, so without this
``h = self.fc(x); if isinstance(h, torch.Tensor): h = h * 2`` would trace *without* the ``* 2``
and the traced module would silently compute something else. While a module is traced,
:func:`isinstance_sees_values` replaces ``builtins.isinstance`` by a function that, for a
:class:`~slapo.trace.tracer.ValueProxy` asked about by the model's code, answers from the proxy's
example value: ``isinstance(h, torch.Tensor)``, ``isinstance(out, (tuple, list))`` (a traced
tuple), ``isinstance(n, int)`` (a traced size) and ``isinstance(w, nn.Parameter)`` take the
branch eager mode takes, and what follows is traced as usual. ``isinstance(h, fx.Proxy)`` stays
true.

Why not a ``__class__`` property on the proxy (which ``isinstance`` also consults): C code asks
``PyObject_IsInstance`` too, and PyTorch's argument parser would then treat the proxy as a real
tensor (``torch.where(mask, proxy, 0.0)`` crashes the interpreter). Replacing the builtin leaves
C untouched. PyTorch's own Python code and this package still see the proxy (``torch.fx`` asks
``isinstance(a, torch.Tensor)`` to decide what becomes a graph constant).

Limits: the answer is fixed at trace time, like other Python control flow (a type that depends on
the input data is not guarded); ``type(h) is torch.Tensor`` and ``issubclass(type(h), ...)``
still see the proxy class: for such code use ``trace(tracer="dynamo")`` or make the module a leaf.
"""

from __future__ import annotations

import builtins
import contextlib
import sys
from typing import Iterator

__all__ = ["isinstance_sees_values"]

_BUILTIN = builtins.isinstance
# Callers that see a proxy as a proxy: PyTorch's own Python (fx's machinery, the metaclass checks
# of ``nn.Parameter``, functional code that dispatches proxies through ``__torch_function__``), as
# before, and the tracer itself. ``torch.is_tensor`` (in ``torch/__init__``) answers as the model.
_PROXY_AWARE = ("torch.", "slapo.trace.")


def _isinstance_for(proxy_cls: type):
    def isinstance(obj, classinfo, /):  # stands in for the builtin
        if (_BUILTIN(obj, proxy_cls) and not _BUILTIN(obj, classinfo)
                and not sys._getframe(1).f_globals.get("__name__", "").startswith(_PROXY_AWARE)):
            try:
                value = type(obj).value.fget(obj)  # not obj.value: no __getattr__ fallback
            except Exception:  # noqa: BLE001 - an attribute the value lacks: not an instance
                return False
            return _BUILTIN(value, classinfo)
        return _BUILTIN(obj, classinfo)

    isinstance.__doc__ = _BUILTIN.__doc__
    return isinstance


@contextlib.contextmanager
def isinstance_sees_values(proxy_cls: type) -> Iterator[None]:
    """Within the block, ``isinstance(p, cls)`` for a ``proxy_cls`` instance ``p`` (with a
    ``value`` property) asked by code outside torch and slapo.trace is ``isinstance(p.value,
    cls)``."""
    previous = builtins.isinstance
    builtins.isinstance = _isinstance_for(proxy_cls)
    try:
        yield
    finally:
        builtins.isinstance = previous
