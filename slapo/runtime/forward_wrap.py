"""Wrapping a module's forward in place, without changing its path or its state-dict keys.

Primitives such as ``checkpoint`` and ``fork_rng`` change *how* a module runs, not what it is.
Instead of inserting a wrapper module (which would rename every parameter below it), they add a
wrapper to the instance's forward chain::

    install_forward_wrapper(mod, "checkpoint", CheckpointForward(path))
    # mod.forward(*a, **kw) == CheckpointForward(path)(<class forward bound to mod>, *a, **kw)

Wrappers are module-level callables ``wrapper(inner_forward, *args, **kwargs)``; the chain is
stored on the module (``mod._slapo_forward_wrappers``), so it survives ``copy.deepcopy`` and
pickling, and the module's paths, hooks and ``state_dict`` are untouched.

When one module takes another's place (``replace``, tracing), wrappers and hooks follow the
position, not the object: :func:`copy_forward_wrappers` and :func:`move_hooks`.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Dict

from torch import nn

__all__ = ["install_forward_wrapper", "forward_wrappers", "has_forward_wrapper", "base_forward",
           "copy_forward_wrappers", "move_hooks"]

_ATTR = "_slapo_forward_wrappers"


def _wrapped_forward(mod: nn.Module, *args, **kwargs):
    fwd = functools.partial(type(mod).forward, mod)
    for wrapper in getattr(mod, _ATTR).values():  # innermost first
        fwd = functools.partial(wrapper, fwd)
    return fwd(*args, **kwargs)


def base_forward(mod: nn.Module) -> Callable:
    """The class-level forward of ``mod`` bound to it (ignores wrappers)."""
    return functools.partial(type(mod).forward, mod)


def forward_wrappers(mod: nn.Module) -> Dict[str, Callable]:
    """The wrappers installed on ``mod``, innermost first (empty dict if none)."""
    return dict(getattr(mod, _ATTR, {}))


def has_forward_wrapper(mod: nn.Module, key: str) -> bool:
    """Whether a wrapper named ``key`` is installed on ``mod``."""
    return key in getattr(mod, _ATTR, {})


def install_forward_wrapper(mod: nn.Module, key: str, wrapper: Callable) -> None:
    """Add ``wrapper`` as the outermost layer of ``mod``'s forward, under the name ``key``."""
    if _ATTR not in mod.__dict__:
        object.__setattr__(mod, _ATTR, {})
        fwd = functools.partial(_wrapped_forward, mod)
        # Keep the class forward's signature visible to inspect (signature checks, tracing).
        fwd.__signature__ = inspect.signature(base_forward(mod))  # type: ignore[attr-defined]
        object.__setattr__(mod, "forward", fwd)
    getattr(mod, _ATTR)[key] = wrapper


def copy_forward_wrappers(src: nn.Module, dst: nn.Module) -> None:
    """Install ``src``'s wrappers on ``dst`` (used when a module is swapped for an equivalent)."""
    for key, wrapper in forward_wrappers(src).items():
        install_forward_wrapper(dst, key, wrapper)


# Hook dictionaries of nn.Module that belong to "how the module is called" and must follow the
# position, not the object. The dict objects themselves are moved so that existing
# RemovableHandles keep working.
_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_backward_pre_hooks",
    "_backward_hooks",
)


def move_hooks(old: nn.Module, new: nn.Module) -> None:
    """Move every forward/backward hook of ``old`` onto ``new`` (keeping ``new``'s own)."""
    for attr in _HOOK_DICTS:
        old_d, new_d = getattr(old, attr, None), getattr(new, attr, None)
        if old_d is None or new_d is None or not old_d:
            continue
        old_d.update(new_d)  # new's hooks run after the moved ones
        object.__setattr__(new, attr, old_d)
        object.__setattr__(old, attr, type(old_d)())
    if getattr(old, "_is_full_backward_hook", None) is not None and old._backward_hooks == {}:
        new._is_full_backward_hook = getattr(new, "_is_full_backward_hook", None) or getattr(
            old, "_is_full_backward_hook", None
        )
