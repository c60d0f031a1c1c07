"""``fuse``: compile a subgraph found by ``find`` into one module (torch.compile backends)."""

from __future__ import annotations

from typing import Any, Optional

from ..errors import PrimitiveError
from .module_checks import format_call
from .registry import Primitive, register_primitive
from .subgraph_replace import RegionModule, as_subgraphs, extract_region, insert_region

__all__ = ["Fuse", "COMPILERS"]

COMPILERS = ("inductor", "aot_eager", "eager", None)


@register_primitive
class Fuse(Primitive):
    name = "fuse"

    @staticmethod
    def apply(sch, subgraph: Any, compiler: Optional[str] = "inductor",
              name: str = "FusedModule") -> str:
        """Compile one subgraph (from ``find`` on a traced module) into one module.

        The subgraph's nodes become one ``call_module`` of a new parameter-free module
        ``<name>_<i>`` registered on the traced module that owns them; it runs the subgraph
        through ``torch.compile(backend=compiler)`` (compiled lazily on first call;
        ``"inductor"`` generates fused kernels, ``"aot_eager"`` is cheap and for tests) or, with
        ``compiler=None``, uncompiled. Modules inside the subgraph stay where they were, so
        parameter paths and ``state_dict`` keys do not change. Typical use: bias + GeLU after
        ``decompose()`` of the Linear before it.

        Returns the new module's name.

        Raises:
            PrimitiveError: unknown compiler; a subgraph of fewer than 2 nodes; several
                subgraphs (only vertical fusion).
            ReplaceError: not a (current) subgraph of this module.
        """
        call = format_call("fuse", subgraph, compiler=compiler)
        if compiler not in COMPILERS:
            hint = f"choose one of {', '.join(map(repr, COMPILERS))}"
            if str(compiler).lower() == "torchscript":
                hint = ("compiler='inductor' (torch.compile generates the fused kernel; "
                        "TorchScript is deprecated), or 'aot_eager', or None for no compiler")
            raise PrimitiveError(f"unknown compiler {compiler!r}", path=sch.path, call=call,
                                 module=sch.mod, hint=hint)
        items = as_subgraphs(sch, subgraph, call)
        if len(items) != 1:
            raise PrimitiveError(f"fuse takes one subgraph, got {len(items)}", path=sch.path,
                                 call=call, module=sch.mod,
                                 hint="only vertical fusion is supported; fuse them one by one")
        s = items[0]
        if len(s.nodes) < 2:
            raise PrimitiveError("a single operation has nothing to fuse", path=sch.path,
                                 call=call, module=sch.mod,
                                 hint="find a pattern of two or more operations")
        gm = sch.root[s.owner].mod
        region = RegionModule(extract_region(gm, s), "fuse", compiler)
        target = insert_region(sch, s, region, name)
        sch.metadata.setdefault("fuse", []).append(f"{target} ({compiler})")
        return target
