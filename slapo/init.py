"""Delayed (meta-device) initialisation: build big models without allocating their weights.

``with slapo.init_empty_weights(): model = Model(config)`` creates every parameter (and, with
``include_buffers=True``, buffer) on the ``meta`` device. The model can then be scheduled and
sharded for free; ``slapo.build(sch, init_weights=...)`` materialises only what this rank keeps.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional, Union

import torch
from torch import nn

from .errors import InitError

__all__ = ["init_empty_weights", "has_meta_tensors", "materialize"]


@contextlib.contextmanager
def init_empty_weights(enable: bool = True, include_buffers: bool = False) -> Iterator[None]:
    """Create new parameters (and optionally buffers) on the meta device inside the block."""
    if not enable:
        yield
        return
    if include_buffers:
        with torch.device("meta"):
            yield
        return
    original = nn.Module.register_parameter

    def register_parameter(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            p = module._parameters[name]
            module._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    nn.Module.register_parameter = register_parameter  # type: ignore[assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[assignment]


def has_meta_tensors(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` lives on the meta device."""
    return any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))


InitFn = Union[bool, None, Callable[..., None]]


def materialize(model: nn.Module, init_weights: InitFn, device: Optional[torch.device] = None):
    """Allocate meta tensors on ``device`` and initialise them.

    ``init_weights`` is a callable ``fn(module)`` applied to every module that owns meta tensors,
    or ``True`` for the modules' own ``reset_parameters()`` / HF ``_init_weights``. Real tensors
    are left untouched.
    """
    if not has_meta_tensors(model):
        return model
    if init_weights in (None, False):
        raise InitError(
            "the model has parameters on the meta device but build() was given no init_weights",
            call="build", hint="pass init_weights=True (modules' own initialisers) or a "
            "function init_weights(module)",
        )
    device = device or torch.device("cpu")
    owners = [m for m in model.modules()
              if any(t.is_meta for t in list(m.parameters(recurse=False))
                     + list(m.buffers(recurse=False)))]
    model.to_empty(device=device, recurse=True)
    for mod in owners:
        _init_module(model, mod, init_weights)
    return model


def _init_module(root: nn.Module, mod: nn.Module, init_weights: InitFn) -> None:
    if callable(init_weights):
        init_weights(mod)
        return
    hf_init = getattr(root, "_init_weights", None)
    if hf_init is not None:
        hf_init(mod)
    elif hasattr(mod, "reset_parameters"):
        mod.reset_parameters()
    else:
        raise InitError(
            f"don't know how to initialise {type(mod).__name__} (no reset_parameters)",
            call="build", hint="pass init_weights=fn(module) that fills its tensors",
        )
