"""``annotate``: attach an attribute to a parameter that survives slapo's re-creations of it."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import AnnotateError
from .module_checks import closest, format_call
from .registry import Primitive, register_primitive

__all__ = ["Annotate", "copy_param_tags"]

# Attributes of a tensor that an annotation must never overwrite.
_RESERVED = set(dir(torch.nn.Parameter(torch.empty(0))))


def copy_param_tags(src: torch.Tensor, dst: torch.Tensor, tags) -> None:
    """Copy the annotated attributes ``tags`` from ``src`` to ``dst`` (where present)."""
    for tag in tags:
        if hasattr(src, tag):
            setattr(dst, tag, getattr(src, tag))


@register_primitive
class Annotate(Primitive):
    name = "annotate"

    @staticmethod
    def apply(sch, param_name: str, key: str, value: Any) -> None:
        """Set attribute ``key = value`` on parameter (or buffer) ``param_name`` of this module.

        The key is registered at the root (``sch.param_tags``) so that every later primitive or
        ``build`` step that re-creates the parameter (sharding, materialisation of meta weights)
        copies it over. Runtimes read such tags, e.g. ``replicated_param=True`` for parameters
        whose gradients must be all-reduced across tensor-parallel ranks.

        Raises:
            AnnotateError: no parameter/buffer of that name; ``key`` is not an identifier or
                would overwrite a tensor attribute (e.g. ``grad``, ``data``, ``shape``).
        """
        call = format_call("annotate", param_name, key, value)
        tensors = dict(sch.mod.named_parameters()) | dict(sch.mod.named_buffers())
        if param_name not in tensors:
            raise AnnotateError(f"no parameter or buffer named '{param_name}'", path=sch.path,
                                call=call, module=sch.mod, hint=closest(param_name, tensors))
        if not isinstance(key, str) or not key.isidentifier():
            raise AnnotateError(f"key {key!r} is not a valid attribute name", path=sch.path,
                                call=call, module=sch.mod, hint="use a Python identifier")
        if key in _RESERVED:
            raise AnnotateError(f"key '{key}' would overwrite a tensor attribute", path=sch.path,
                                call=call, module=sch.mod,
                                hint="choose a name that tensors do not already have")
        setattr(tensors[param_name], key, value)
        sch.param_tags.add(key)
        sch.metadata.setdefault("annotate", {})[f"{param_name}.{key}"] = value
