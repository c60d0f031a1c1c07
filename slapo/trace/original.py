"""The module a ``GraphModule`` was traced from, for code that dispatches on the module's class.

Tracing replaces a module by an ``fx.GraphModule`` with the same children, tensors and plain
attributes, but not the same class. Initialisers dispatch on the class (HF's ``_init_weights``:
``isinstance(module, T5ForConditionalGeneration)`` initialises ``module.shared``; a module's own
``reset_parameters()``), so delayed initialisation of a traced meta model would give other
values than of the untraced one. The traced module therefore keeps the original object (in
``gm.meta``, not as a child) and, for a HF model, its bound ``_init_weights``; :func:`as_original`
shows an initialiser the original object holding the traced module's current children and
tensors.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch.fx as fx
from torch import nn

__all__ = ["keep_original", "as_original"]

_KEY = "slapo_original"


def keep_original(mod: nn.Module, gm: fx.GraphModule) -> None:
    """Record ``mod`` as the module ``gm`` was traced from."""
    gm.meta[_KEY] = mod
    if callable(getattr(type(mod), "_init_weights", None)):
        gm._init_weights = mod._init_weights  # bound to the original, which holds the config


@contextlib.contextmanager
def as_original(mod: nn.Module) -> Iterator[nn.Module]:
    """``mod`` itself, or for a traced module the original it was traced from, holding
    ``mod``'s current children, parameters and buffers (writes through it are copied back)."""
    original = getattr(mod, "meta", {}).get(_KEY) if isinstance(mod, fx.GraphModule) else None
    if original is None:
        yield mod
        return
    for name in ("_modules", "_parameters", "_buffers"):
        table = getattr(original, name)
        table.clear()
        table.update(getattr(mod, name))
    try:
        yield original
    finally:
        mod._parameters.update(original._parameters)
        mod._buffers.update(original._buffers)
