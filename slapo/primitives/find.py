"""``find``: a query on traced modules (not recorded in the history; its results are)."""

from __future__ import annotations

from typing import Callable, Optional

import torch.fx as fx

from ..errors import PatternError
from ..trace.dynamo import is_dynamo_graph
from ..trace.pattern import (PatternLike, SubgraphList, explain_no_match, find_nodes,
                             find_subgraphs, graph_modules, module_names, validate_pattern)
from .module_checks import format_call
from .registry import Primitive, register_primitive

__all__ = ["Find"]


@register_primitive
class Find(Primitive):
    name = "find"
    record = False

    @staticmethod
    def apply(
        sch,
        pattern: Optional[PatternLike] = None,
        *,
        where: Optional[Callable[[fx.Node], bool]] = None,
        allow_empty: bool = False,
    ) -> SubgraphList:
        """Find nodes or subgraphs in the traced module(s) at and below this node.

        ``pattern``: a regex on called module names (``re.match`` on the ``call_module``
        target relative to its traced parent), or a pattern function / ``nn.Module`` matched
        by data edges (see :mod:`slapo.trace.pattern`). ``where``: a node predicate (alone, or to
        filter the matches' output nodes). Every GraphModule at or below this node is
        searched (outermost first).

        Returns a list of :class:`slapo.trace.pattern.Subgraph` in graph order (non-overlapping),
        accepted by ``replace``/``checkpoint``/``fuse``; the list and each item record
        themselves in the history as this ``find`` call, so a replay finds them again.

        Raises:
            PatternError: invalid query; nothing traced here (call ``trace`` first); nothing
                found (unless ``allow_empty=True``).
        """
        call = format_call("find", *([pattern] if pattern is not None else []),
                           **({"where": where} if where is not None else {}))
        validate_pattern(pattern, where)
        graphs = graph_modules(sch)
        if not graphs:
            raise PatternError("nothing is traced at or below this module", path=sch.path,
                               call=call, module=sch.mod,
                               hint=f"call sch[{sch.path!r}].trace(...) first")
        flat = [path for path, gm in graphs if is_dynamo_graph(gm)]
        if isinstance(pattern, str) and len(flat) == len(graphs):
            raise PatternError(
                f"'{flat[0] or '<root>'}' was traced with tracer='dynamo': a flat graph of ATen "
                "operations without module calls, so a regex on module names matches nothing",
                path=sch.path, call=call, module=sch.mod,
                hint=f"find(where=slapo.trace.dynamo.from_module({pattern!r})) selects the "
                "operations that module ran; a pattern function matches operations (F.linear "
                "matches aten.linear); or trace with the default tracer")
        found = SubgraphList()
        for path, gm in graphs:
            if pattern is None or isinstance(pattern, str):
                found.extend(find_nodes(path, gm, pattern, where))
            else:
                hits = find_subgraphs(path, gm, pattern)
                found.extend(h for h in hits if where is None or where(h.output))
        why = None if found or allow_empty or pattern is None or isinstance(pattern, str) \
            else explain_no_match(graphs, pattern)
        if why is not None:
            raise PatternError(f"no match: {why[0]}", path=sch.path, call=call, module=sch.mod,
                               hint=why[1])
        if not found and not allow_empty:
            names = sorted({name for _, gm in graphs for name in module_names(gm)})
            raise PatternError(
                "no match", path=sch.path, call=call, module=sch.mod,
                hint=("modules that ran here (nn_module_stack of the dynamo graph): " if flat
                      else "called modules here: ") + ", ".join(names[:12]) if names else
                "the traced graph calls no modules; check the pattern's operations",
            )
        for i, sg in enumerate(found):
            sg.query = (sch.path, pattern, where, i)
        found.query = (sch.path, pattern, where)
        return found
