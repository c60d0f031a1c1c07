"""``replace``: put another module (or, on a traced module, a function) in place of a module or of
a subgraph found by ``find``."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Union

from torch import nn

from ..errors import ReplaceError
from ..runtime.forward_wrap import move_hooks
from .module_checks import format_call, signature_mismatch
from .registry import Primitive, register_primitive

__all__ = ["Replace"]

@register_primitive
class Replace(Primitive):
    name = "replace"
    original_kwargs = {
        "target_ops": "replace(new, subgraph): pass what find() returned as the second "
                      "argument",
    }

    @staticmethod
    def apply(
        sch,
        new: Union[nn.Module, Callable],
        subgraph: Optional[Any] = None,
        *,
        name: Optional[str] = None,
        concrete_args: Optional[Dict[str, Any]] = None,
        check_signature: bool = True,
    ) -> Any:
        """Replace this module, or a subgraph of it, by ``new``.

        Whole module (``subgraph=None``): ``new`` (an ``nn.Module``) takes this module's place in
        its parent; the path stays the same. Forward/backward hooks registered on the old module
        move to the new one, and schedule nodes of submodules that ``new`` reuses keep their
        metadata. ``new`` must be callable the way the parent calls the old module (checked from
        the forward signatures unless ``check_signature=False``).

        Subgraph (``subgraph`` from ``find`` on a traced module): the subgraph's nodes are
        replaced by one call of ``new`` (a module or a function); see :mod:`slapo.trace.tracer`.

        Before: ``sch[p].mod`` is the old module. After: ``sch[p].mod is new``.

        Raises:
            ReplaceError: ``new`` is not a module (whole-module form) or is this very module;
                the forward signatures are incompatible; ``name``/``concrete_args`` given without
                a subgraph.
        """
        call = format_call("replace", new, *( [subgraph] if subgraph is not None else []))
        if subgraph is not None:
            from .subgraph_replace import replace_subgraph  # provided with trace-by-need

            return replace_subgraph(sch, new, subgraph, name=name, concrete_args=concrete_args)
        if name is not None or concrete_args is not None:
            raise ReplaceError(
                "`name` and `concrete_args` only apply when replacing a subgraph",
                path=sch.path, call=call, module=sch.mod,
                hint="drop them, or pass the subgraph returned by find(...)",
            )
        if not isinstance(new, nn.Module):
            raise ReplaceError(
                f"expected an nn.Module to replace the whole module, got {type(new).__name__}",
                path=sch.path, call=call, module=sch.mod,
                hint="wrap the function in an nn.Module, or trace() the parent and replace a "
                "subgraph found with find(...)",
            )
        if new is sch.mod:
            raise ReplaceError("the new module is the module already at this path",
                               path=sch.path, call=call, module=sch.mod,
                               hint="pass a different module instance")
        if check_signature:
            reasons = signature_mismatch(sch.mod, new)
            if reasons:
                raise ReplaceError(
                    f"{type(new).__name__}.forward is not call-compatible with "
                    f"{type(sch.mod).__name__}.forward: " + "; ".join(reasons),
                    path=sch.path, call=call, module=sch.mod,
                    hint="give the new forward the same parameters (or *args/**kwargs), or pass "
                    "check_signature=False if the parent never uses them",
                )
        old = sch.mod
        move_hooks(old, new)
        sch.swap_module(new)
        sch.metadata.setdefault("replace", []).append(
            f"{type(old).__name__} -> {type(new).__name__}"
        )
        return new
