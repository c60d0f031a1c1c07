"""``find``: locate nodes and subgraphs in traced modules.

Three kinds of query, all on GraphModules produced by ``trace``:

* a regex (``str``) on the names of called modules (``re.match`` on the ``call_module`` target,
  e.g. ``r"(query|key|value)"``); each hit is a one-node subgraph;
* a node predicate (``where=lambda node: ...``); each node it accepts is a one-node subgraph;
* a subgraph pattern: a function (``lambda x, b: F.gelu(x + b)``) or an ``nn.Module`` whose
  traced graph is matched **by data edges** from its output backwards: operations must feed
  each other exactly as in the pattern (argument positions are checked; ``add``/``mul`` are
  commutative), each pattern input binds one value consistently, and no intermediate result
  may be used outside the match. Functional and module forms are interchangeable (``F.gelu``
  matches ``nn.GELU``, ``F.linear`` matches ``nn.Linear``, ``x + y`` matches ``torch.add``),
  and :func:`call_module` ``("regex", x)`` matches a call of a module whose name matches
  (on a ``tracer="dynamo"`` graph: the operations that call ran, by ``nn_module_stack``).

Results are :class:`Subgraph` objects (graph order, non-overlapping) that ``replace``,
``checkpoint`` and ``fuse`` accept; a history replay finds them again on the new model.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.fx as fx
from torch import nn

from ..errors import PatternError
from ..history import Deferred
from .dynamo import is_dynamo_graph, module_call, module_paths, module_region

__all__ = ["Subgraph", "SubgraphList", "call_module", "find_subgraphs", "graph_modules"]

PatternLike = Union[str, Callable, nn.Module]


def call_module(name_regex: str, *args: Any) -> Any:
    """In a pattern function: stands for a call of any module whose name matches the regex
    (the whole name: ``re.fullmatch``). Works however it is referenced (``call_module``,
    ``slapo.call_module``): called on a traced pattern input it records itself.

    On a flat ``tracer="dynamo"`` graph it matches the operations one call of such a module
    ran (``node.meta["nn_module_stack"]``; the name is the path relative to the traced module,
    ``query``, or the original Slapo's dynamo name ``self_query``) with the call's inputs as
    its arguments (parameters stay inside), so a pattern serves both tracers."""
    for a in args:
        if isinstance(a, fx.Proxy):
            return a.tracer.create_proxy("call_function", call_module, (name_regex, *args), {})
    raise PatternError("slapo.trace.pattern.call_module only has a meaning inside a find() pattern",
                       hint="use it in a pattern function passed to find()")



_MODULE_AS_FUNCTION = {
    nn.Linear: "linear", nn.GELU: "gelu", nn.ReLU: "relu", nn.SiLU: "silu", nn.Tanh: "tanh",
    nn.Dropout: "dropout", nn.LayerNorm: "layer_norm", nn.Embedding: "embedding",
    nn.Softmax: "softmax", nn.Conv1d: "conv1d", nn.Conv2d: "conv2d", nn.GroupNorm: "group_norm",
    nn.Sigmoid: "sigmoid", nn.BatchNorm2d: "batch_norm", nn.MSELoss: "mse_loss",
    nn.CrossEntropyLoss: "cross_entropy",
}
_ALIASES = {"iadd": "add", "matmul": "matmul", "truediv": "div", "floordiv": "floor_divide",
            "sub": "sub", "mm": "matmul", "bmm": "matmul"}
_COMMUTATIVE = {"add", "mul"}


class _Inner:
    """Key in a match's bindings for a node of a flat module call other than its result."""

    op = "inner"


@dataclasses.dataclass(eq=False)
class Subgraph:
    """Nodes of one traced GraphModule that ``replace``/``checkpoint``/``fuse`` act on.

    Attributes:
        owner: schedule path of the GraphModule that holds the nodes.
        nodes: the nodes, in graph order (the last one is ``output``).
        inputs: values from outside the subgraph, in call order (pattern-input order for
            pattern matches, first use otherwise): ``fx.Node`` or constants.
        output: the node whose value the subgraph produces.
        query: ``(path, pattern, where, index)`` of the ``find`` call, to find it again.
    """

    owner: str
    nodes: List[fx.Node]
    inputs: List[Any]
    output: fx.Node
    query: Optional[Tuple[str, Any, Any, int]] = None

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self):
        raise PatternError(
            "a find() result is a list of Subgraph objects, not the original Slapo's "
            "(parent name, node) pairs", call="iter(Subgraph)",
            hint="use sg.owner (path of the traced module), sg.output and sg.nodes (fx nodes); "
            "pass the Subgraph itself to replace/fuse/checkpoint")

    def __repr__(self) -> str:
        ops = ", ".join(str(n.target) if n.op == "call_module" else n.name for n in self.nodes)
        return f"Subgraph(owner={self.owner!r}, nodes=[{ops}])"

    def __slapo_record__(self) -> Deferred:
        if self.query is None:
            raise PatternError("this subgraph was not made by find() and cannot be recorded",
                               hint="pass subgraphs returned by sch.find(...)")
        path, pattern, where, index = self.query
        return Deferred(f"{_find_source(path, pattern, where)}[{index}]",
                        lambda root: root[path].find(pattern, where=where)[index])


class SubgraphList(list):
    """The list ``find`` returns; recorded in the history as the ``find`` call itself."""

    query: Optional[Tuple[str, Any, Any]] = None

    def __slapo_record__(self) -> Deferred:
        path, pattern, where = self.query  # type: ignore[misc]
        return Deferred(_find_source(path, pattern, where),
                        lambda root: root[path].find(pattern, where=where))


def _find_source(path: str, pattern: Any, where: Any) -> str:
    def name(obj: Any) -> str:
        if obj is None or isinstance(obj, str):
            return repr(obj)
        qual = getattr(obj, "__qualname__", type(obj).__qualname__)
        return f"{getattr(obj, '__module__', '?')}.{qual}"

    target = f"sch[{path!r}]" if path else "sch"
    args = [name(pattern)] if pattern is not None else []
    if where is not None:
        args.append(f"where={name(where)}")
    return f"{target}.find({', '.join(args)})"


def graph_modules(sch) -> List[Tuple[str, fx.GraphModule]]:
    """``(schedule path, GraphModule)`` for every traced module at or below ``sch``."""
    return [(node.path, node.mod) for _, node in sch.named_schedules()
            if isinstance(node.mod, fx.GraphModule)]


# ---------------------------------------------------------------------- op identity
def _op_name(node: fx.Node, owner: Optional[nn.Module]) -> str:
    if node.op == "call_module":
        mod = owner.get_submodule(node.target) if owner is not None else None
        for cls, fn_name in _MODULE_AS_FUNCTION.items():
            if type(mod) is cls:
                return fn_name
        return f"module:{type(mod).__name__}"
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        name = node.target.overloadpacket.__name__  # aten.add.Tensor (dynamo graphs) -> add
    elif node.op == "call_function":
        name = getattr(node.target, "__name__", str(node.target)).strip("_")
    elif node.op == "call_method":
        name = node.target
    else:
        return node.op
    return _ALIASES.get(name, name)


def _is_module_form(node: fx.Node) -> bool:
    return node.op == "call_module" or (node.op == "call_function"
                                        and node.target is call_module)


# ---------------------------------------------------------------------- pattern matching
def _trace_pattern(pattern: Union[Callable, nn.Module]) -> Tuple[fx.GraphModule, fx.Node]:
    try:
        tracer = fx.Tracer(autowrap_functions=(call_module,))
        graph = tracer.trace(pattern)
        gm = fx.GraphModule(tracer.root, graph)
    except Exception as e:  # noqa: BLE001 - user pattern
        raise PatternError(f"the pattern could not be traced: {type(e).__name__}: {e}",
                           call="find(pattern)",
                           hint="write the pattern with torch operations on its inputs only"
                           ) from None
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    if not isinstance(out, fx.Node) or out.op == "placeholder":
        raise PatternError("a pattern must return exactly one computed value",
                           call="find(pattern)", hint="return a single tensor expression")
    return gm, out


class _Matcher:
    def __init__(self, pattern_gm: fx.GraphModule, owner: nn.Module,
                 one_value_per_input: bool = True):
        self.pgm, self.owner = pattern_gm, owner
        self.one_value_per_input = one_value_per_input
        self.flat = is_dynamo_graph(owner)

    def node_matches(self, p: fx.Node, g: fx.Node) -> bool:
        if g.op not in ("call_function", "call_method", "call_module"):
            return False
        if p.op == "call_function" and p.target is call_module:
            if self.flat:
                return module_call(g, p.args[0]) is not None
            return g.op == "call_module" and re.fullmatch(p.args[0], g.target) is not None
        if p.op == "call_module" and g.op == "call_module":
            if type(self.pgm.get_submodule(p.target)) is type(self.owner.get_submodule(g.target)):
                return True
        return _op_name(p, self.pgm) == _op_name(g, self.owner)

    def match(self, p: Any, g: Any, bind: Dict[fx.Node, Any]) -> bool:
        if isinstance(p, fx.Node) and p.op == "placeholder":
            if p in bind:
                if not self.one_value_per_input:
                    return True
                return bind[p] is g if isinstance(g, fx.Node) else bind[p] == g
            bind[p] = g
            return True
        if not isinstance(p, fx.Node):
            return not isinstance(g, fx.Node) and (p == g or not isinstance(p, (int, float)))
        if not isinstance(g, fx.Node):
            return False
        if p in bind:
            return bind[p] is g
        if g in bind.values() or not self.node_matches(p, g):
            return False
        if self.flat and p.target is call_module:
            return self.match_module_call(p, g, bind)
        p_args = list(p.args[1:] if p.target is call_module else p.args)
        g_args = list(g.args)
        if _is_module_form(p) != _is_module_form(g):  # functional vs module: data input only
            p_args, g_args = p_args[:1], g_args[:1]
        if len(p_args) > len(g_args):
            return False
        orders = [g_args]
        if _op_name(p, self.pgm) in _COMMUTATIVE and len(g_args) == 2:
            orders.append(g_args[::-1])
        for cand in orders:
            trial = dict(bind)
            trial[p] = g
            if all(self.match(pa, ga, trial) for pa, ga in zip(p_args, cand)):
                bind.clear()
                bind.update(trial)
                return True
        return False

    def match_module_call(self, p: fx.Node, g: fx.Node, bind: Dict[Any, Any]) -> bool:
        """``call_module(regex, *args)`` against the flat module call that produced ``g``."""
        nodes, inputs = module_region(g, module_call(g, p.args[0]))
        taken = set(bind.values())
        p_args = list(p.args[1:])
        if any(n in taken for n in nodes) or len(p_args) != len(inputs):
            return False
        trial = dict(bind)
        trial[p] = g
        trial.update((_Inner(), n) for n in nodes if n is not g)
        if all(self.match(pa, ga, trial) for pa, ga in zip(p_args, inputs)):
            bind.clear()
            bind.update(trial)
            return True
        return False


def find_subgraphs(owner_path: str, owner: fx.GraphModule,
                   pattern: Union[Callable, nn.Module], *, one_value_per_input: bool = True,
                   private: bool = True) -> List[Subgraph]:
    """Non-overlapping matches of ``pattern`` in ``owner``'s graph, in graph order.

    ``one_value_per_input=False`` lets a pattern input bind different values at its uses, and
    ``private=False`` accepts matches whose intermediate values are used outside them: both
    only to explain a miss (:func:`explain_no_match`), never to replace."""
    pgm, p_out = _trace_pattern(pattern)
    placeholders = [n for n in pgm.graph.nodes if n.op == "placeholder"]
    matcher = _Matcher(pgm, owner, one_value_per_input)
    order = {n: i for i, n in enumerate(owner.graph.nodes)}
    taken: set = set()
    found: List[Subgraph] = []
    for g in owner.graph.nodes:
        bind: Dict[fx.Node, Any] = {}
        if g in taken or not matcher.match(p_out, g, bind):
            continue
        nodes = sorted((v for k, v in bind.items() if k.op != "placeholder"), key=order.get)
        inner = set(nodes)
        if inner & taken:
            continue
        if private and any(u not in inner for n in nodes if n is not g for u in n.users):
            continue  # an intermediate value is used elsewhere: cannot be replaced
        taken |= inner
        inputs = [bind[ph] for ph in placeholders if ph in bind]
        found.append(Subgraph(owner_path, nodes, inputs, g))
    return found


def explain_no_match(graphs: List[Tuple[str, fx.GraphModule]],
                     pattern: Union[Callable, nn.Module]) -> Optional[Tuple[str, str]]:
    """``(why, what to do)`` when ``pattern`` matched nothing in ``graphs`` because of a rule in
    which this matcher deliberately differs from the original Slapo's, else ``None``."""
    pgm, _ = _trace_pattern(pattern)
    names = [name for _, gm in graphs for name in module_names(gm)]
    for pn in pgm.graph.nodes:
        if pn.op == "call_function" and pn.target is call_module:
            regex = pn.args[0]
            prefixed = [t for t in names if re.match(regex, t)]
            if prefixed and not any(re.fullmatch(regex, t) for t in names):
                return (f"call_module({regex!r}) must match a whole module name (re.fullmatch; "
                        "the original matched a prefix, which here would match "
                        f"{', '.join(map(repr, prefixed[:3]))})",
                        f"write call_module({regex + '.*'!r}, ...) to match names that start "
                        "that way")
    if any(find_subgraphs(path, gm, pattern, one_value_per_input=False) for path, gm in graphs):
        reused = [n.name for n in pgm.graph.nodes if n.op == "placeholder" and sum(
            a is n for u in n.users for a in (*u.args, *u.kwargs.values())) > 1]
        return (f"each pattern input binds one value, and input {', '.join(reused) or '?'} "
                "would need different values at its uses here (the original matched "
                "operations in order without checking which values feed them)",
                "give each use its own pattern input (lambda x, y: ... instead of lambda x: "
                "...) if different values are meant")
    if any(find_subgraphs(path, gm, pattern, private=False) for path, gm in graphs):
        return ("the operations match, but an intermediate value of the match is also used "
                "outside it, so replacing the match would drop that use (the original "
                "replaced it anyway)",
                "extend the pattern to the other use of that value, or replace the operations "
                "one at a time")
    return None


def module_names(gm: fx.GraphModule) -> List[str]:
    """Names ``call_module`` patterns match in ``gm``: called modules, or on a dynamo graph
    the paths of the modules that ran."""
    if is_dynamo_graph(gm):
        return module_paths(gm)
    return [n.target for n in gm.graph.nodes if n.op == "call_module"]


def node_subgraph(owner_path: str, node: fx.Node) -> Subgraph:
    """A one-node subgraph; its inputs are the node's argument nodes in order."""
    inputs: List[Any] = []
    fx.node.map_arg((node.args, node.kwargs),
                    lambda n: inputs.append(n) if n not in inputs else None)
    return Subgraph(owner_path, [node], inputs, node)


def find_nodes(owner_path: str, owner: fx.GraphModule, regex: Optional[str],
               where: Optional[Callable[[fx.Node], bool]]) -> List[Subgraph]:
    """One-node subgraphs for ``call_module`` nodes matching ``regex`` and/or ``where``."""
    out = []
    for node in owner.graph.nodes:
        if regex is not None and not (node.op == "call_module"
                                      and re.match(regex, node.target)):
            continue
        if where is not None and not where(node):
            continue
        if node.op in ("placeholder", "output"):
            continue
        out.append(node_subgraph(owner_path, node))
    return out


def validate_pattern(pattern: Any, where: Any) -> None:
    """Raise PatternError for a query ``find`` cannot run."""
    if pattern is None and where is None:
        raise PatternError("find() needs a pattern or where=", call="find()",
                           hint="pass a regex on module names, a pattern function or module, "
                           "or where=lambda node: ...")
    if isinstance(pattern, str):
        try:
            re.compile(pattern)
        except re.error as e:
            raise PatternError(f"invalid regex {pattern!r}: {e}", call="find()",
                               hint="check the regular expression") from None
    elif pattern is not None and not callable(pattern):
        raise PatternError(f"cannot search for a {type(pattern).__name__}",
                           call=f"find({pattern!r})",
                           hint="pass a str regex, a function or an nn.Module pattern")
    if where is not None and not callable(where):
        raise PatternError("where= must be a function node -> bool", call="find()",
                           hint="e.g. where=lambda n: n.op == 'call_module'")

