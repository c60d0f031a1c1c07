"""The module a traced or fused module stands for, for code that dispatches on the class.

Tracing replaces a module by an ``fx.GraphModule`` with the same children, tensors and plain
attributes, but not the same class; ``sync`` swaps a row-parallel ``nn.Linear`` for a
``LinearWithSync`` holding the same parameters. Initialisers dispatch on the class (HF's
``_init_weights``: ``isinstance(module, T5ForConditionalGeneration)`` initialises
``module.shared``; a module's own ``reset_parameters()``), so delayed initialisation of a traced
meta model would give other values than of the untraced one (or none at all: ``LinearWithSync``
has no initialiser). Such a module therefore keeps the original object (:func:`keep_original`:
a plain attribute, not a child) and, for a HF model, its bound ``_init_weights``;
:func:`as_original` shows an initialiser the original object holding the module's current
children and tensors.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn

__all__ = ["keep_original", "as_original"]

_KEY = "_slapo_original"


def keep_original(mod: nn.Module, new: nn.Module) -> None:
    """Record ``mod`` as the module ``new`` stands for (same children and tensor names); so
    does every descendant of ``new`` whose class differs from the one at the same path below
    ``mod`` (a flat ``torch.export`` graph turns BERT's ``query`` Linear into a plain attribute
    holder, which HF's ``_init_weights`` would not recognise)."""
    _keep(mod, new)
    below = dict(mod.named_modules())
    for path, holder in new.named_modules():
        old = below.get(path)
        if path and old is not None and type(old) is not type(holder) and \
                _KEY not in holder.__dict__:
            _keep(old, holder)


def _keep(mod: nn.Module, new: nn.Module) -> None:
    new.__dict__[_KEY] = mod  # not a child: it must not appear in named_modules()
    if callable(getattr(type(mod), "_init_weights", None)):
        new._init_weights = mod._init_weights  # bound to the original, which holds the config


@contextlib.contextmanager
def as_original(mod: nn.Module) -> Iterator[nn.Module]:
    """``mod`` itself, or the original it stands for (:func:`keep_original`), holding ``mod``'s
    current children, parameters and buffers (writes through it are copied back)."""
    original = mod.__dict__.get(_KEY)
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
