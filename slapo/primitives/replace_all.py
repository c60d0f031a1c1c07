"""``replace_all``: replace every module of a type below this node."""

from __future__ import annotations

from typing import Any, Callable, List, Tuple, Type, Union

from torch import nn

from ..errors import ReplaceError
from .module_checks import format_call
from .registry import Primitive, register_primitive

__all__ = ["ReplaceAll"]


@register_primitive
class ReplaceAll(Primitive):
    name = "replace_all"

    @staticmethod
    def apply(
        sch,
        module_type: Union[Type[nn.Module], Tuple[Type[nn.Module], ...]],
        make_fn: Callable[..., nn.Module],
        **kwargs: Any,
    ) -> List[str]:
        """Replace every submodule that is an instance of ``module_type``.

        ``make_fn(path, old_module, **kwargs)`` builds each replacement (``path`` is relative to
        this node). The set of targets is taken before any replacement, so modules created by
        ``make_fn`` are never replaced again (wrapping a ``Linear`` in a ``Sequential`` with a
        ``Linear`` inside does not recurse). This node itself is not replaced.

        Returns the (relative) paths that were replaced, in pre-order.

        Raises:
            ReplaceError: ``module_type`` is not a module class; ``make_fn`` is not callable or
                returns a non-module; no module of that type exists below this node.
        """
        call = format_call("replace_all", module_type, make_fn)
        types = module_type if isinstance(module_type, tuple) else (module_type,)
        if not all(isinstance(t, type) and issubclass(t, nn.Module) for t in types):
            raise ReplaceError(f"module_type must be an nn.Module class, got {module_type!r}",
                               path=sch.path, call=call, module=sch.mod,
                               hint="pass e.g. torch.nn.GELU or a tuple of classes")
        if not callable(make_fn):
            raise ReplaceError("make_fn is not callable", path=sch.path, call=call,
                               module=sch.mod, hint="pass a function (path, old_module) -> module")
        targets = [(n, s) for n, s in sch.named_schedules() if n and isinstance(s.mod, types)]
        if not targets:
            raise ReplaceError(
                f"no submodule of type {', '.join(t.__name__ for t in types)} found",
                path=sch.path, call=call, module=sch.mod,
                hint="check the type (e.g. transformers' Conv1D is not nn.Linear)",
            )
        done = []
        for rel, sub in targets:
            if rel not in sch or sch[rel] is not sub:
                continue  # an enclosing module was replaced already
            new = make_fn(rel, sub.mod, **kwargs)
            if not isinstance(new, nn.Module):
                raise ReplaceError(
                    f"make_fn returned {type(new).__name__} for '{rel}', not an nn.Module",
                    path=sch.path, call=call, module=sch.mod,
                    hint="make_fn must return the replacement module",
                )
            sub.replace(new)
            done.append(rel)
        return done
