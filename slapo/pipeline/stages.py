"""Pipeline stages that keep the original parameter paths.

``sch["bert.encoder.layer.1"].cut_pipeline_stage()`` marks a *cut after* that module (its
parent must be traced, e.g. with ``sch.trace_until("bert.encoder")``). :func:`build_pipeline_stages`
then

1. inlines the traced modules on the way from the root to every cut into one flat graph whose
   ``call_module``/``get_attr`` targets are full paths (``bert.encoder.layer.0``);
2. numbers nodes by stage (a cut node closes its stage);
3. computes liveness: every value defined before a cut and used after it crosses that cut, and
   is forwarded through intermediate stages, always as tensors (:mod:`slapo.pipeline.values`):
   tensors as they are, ``None`` re-created, ints/shapes packed into tensors, nested
   tuples/lists/dicts (LLaMA's rotary ``(cos, sin)``, a layer's output tuple) flattened into
   their leaves and rebuilt on the receiving stage; any other object is an error;
4. builds one ``GraphModule`` per stage from the root, so a stage's ``state_dict`` keys are the
   original ones (``bert.encoder.layer.2.output.dense.weight``) and the stages' keys together are
   exactly the original model's; tied parameters used by several stages appear in each and are
   reported by :func:`tied_parameters`.

Stage 0 takes the model's own arguments (names and defaults); later stages take the live values
of the cut before them, positionally; non-last stages return a tuple of the next stage's inputs.
:class:`PipelineRunner` (:mod:`slapo.pipeline.runner`) trains the stages with
``torch.distributed.pipelining`` (GPipe or 1F1B), one stage per rank, all-reducing gradients of
tied parameters across stages.
"""

from __future__ import annotations

import operator
from typing import Any, Dict, List, Sequence, Tuple

import torch.fx as fx
from torch import nn
from torch.fx.node import map_arg

from ..errors import PipelineError
from .values import Crossing, FlattenTree, RebuildTree, crossing, pack_value, unpack_value

__all__ = ["build_pipeline_stages", "CUTS_KEY"]

CUTS_KEY = "cut_pipeline_stage"  # root metadata: the cut paths, in call order


def _identity(x: Any) -> Any:
    return x


# ---------------------------------------------------------------------- flattening
def _inline(graph: fx.Graph, call: fx.Node, sub: fx.GraphModule, prefix: str) -> None:
    args, kwargs = list(call.args), dict(call.kwargs)
    env: Dict[fx.Node, Any] = {}
    out: Any = None
    with graph.inserting_before(call):
        for n in sub.graph.nodes:
            if n.op == "placeholder":
                t = n.target
                if t.startswith("**"):
                    env[n], kwargs = dict(kwargs), {}
                elif t.startswith("*"):
                    env[n], args = tuple(args), []
                elif args:
                    env[n] = args.pop(0)
                else:
                    env[n] = kwargs.pop(t, n.args[0] if n.args else None)
            elif n.op == "output":
                out = map_arg(n.args[0], lambda x: env[x])
            else:
                new = graph.node_copy(n, lambda x: env[x])
                if n.op in ("call_module", "get_attr"):
                    new.target = f"{prefix}.{n.target}"
                env[n] = new
        if not isinstance(out, fx.Node):
            out = graph.call_function(_identity, (out,))
    call.replace_all_uses_with(out)
    graph.erase_node(call)


def _set_value(node: fx.Node, value: Any) -> None:
    """Replace every use of ``node`` by ``value`` (a node or a constant)."""
    for user in list(node.users):
        user.args = map_arg(user.args, lambda x: value if x is node else x)
        user.kwargs = map_arg(user.kwargs, lambda x: value if x is node else x)


def _structure(node: Any) -> Any:
    """The literal structure a node stands for (identity or output-builder), else None."""
    if isinstance(node, fx.Node) and node.op == "call_function":
        if node.target is _identity:
            return node.args[0]
        # a tracer's output builder (slapo.trace.example_values, a sibling layer: by marker)
        if getattr(node.target, "_slapo_output_builder", False) is True:
            return dict(node.args[0])
    return None


def _simplify(graph: fx.Graph) -> None:
    """Resolve ``getitem``/``getattr`` on literal tuples, dicts and rebuilt model outputs."""
    changed = True
    while changed:
        changed = False
        for n in list(graph.nodes):
            if n.op != "call_function" or n.target not in (operator.getitem, getattr):
                continue
            src, key = n.args[0], n.args[1]
            struct = src if isinstance(src, (tuple, list, dict)) else _structure(src)
            if struct is None:
                continue
            is_output = isinstance(src, fx.Node) and src.target is not _identity
            if isinstance(struct, dict) and isinstance(key, int) and is_output:
                struct = [v for v in struct.values() if v is not None]
            try:
                value = struct[key]
            except (KeyError, IndexError, TypeError):
                if n.target is getattr and isinstance(struct, dict):
                    value = struct.get(key)
                else:
                    continue
            _set_value(n, value)
            graph.erase_node(n)
            changed = True
        for n in reversed(list(graph.nodes)):
            if not n.users and _structure(n) is not None and n.op != "output":
                graph.erase_node(n)
                changed = True


def _flat_graph(sch, cuts: Sequence[str]) -> Tuple[fx.GraphModule, fx.Graph]:
    root = sch.root
    if not isinstance(root.mod, fx.GraphModule):
        raise PipelineError("the root module is not traced", path="", call="build stages",
                            module=root.mod, hint="call sch.trace_until([...parents of the "
                            "cut modules...]) before cutting")
    graph = fx.Graph()
    graph.output(graph.graph_copy(root.mod.graph, {}))
    while True:
        todo = [n for n in graph.nodes if n.op == "call_module"
                and any(c.startswith(n.target + ".") for c in cuts)]
        if not todo:
            break
        for n in todo:
            sub = root.mod.get_submodule(n.target)
            if not isinstance(sub, fx.GraphModule):
                raise PipelineError(f"'{n.target}' (on the way to a cut) is not traced",
                                    path=n.target, call="build stages", module=sub,
                                    hint=f"call sch.trace_until({list(cuts)!r})")
            _inline(graph, n, sub, n.target)
    _simplify(graph)
    return root.mod, graph


# ---------------------------------------------------------------------- stages
def build_pipeline_stages(sch) -> List[fx.GraphModule]:
    """Split the scheduled model at its cuts into stage modules (see module docstring).

    Raises:
        PipelineError: no cuts; an ancestor of a cut is not traced; a cut module is not called
            exactly once at the flattened level; a value that cannot travel as tensors (see
            :mod:`slapo.pipeline.values`) crosses a cut.
    """
    cuts = list(sch.root.metadata.get(CUTS_KEY, []))
    if not cuts:
        raise PipelineError("no pipeline cuts", path=sch.path, call="build stages",
                            hint="mark stage ends with sch['<path>'].cut_pipeline_stage()")
    root_mod, graph = _flat_graph(sch, cuts)
    nodes = list(graph.nodes)
    calls = {c: [n for n in nodes if n.op == "call_module" and n.target == c] for c in cuts}
    for c, found in calls.items():
        if len(found) != 1:
            raise PipelineError(f"'{c}' is called {len(found)} times in the flattened graph",
                                path=c, call="cut_pipeline_stage()",
                                hint="cut after a module that runs exactly once per forward")
    stage_of: Dict[fx.Node, int] = {}
    stage = 0
    for n in nodes:
        if n.op == "get_attr":
            continue
        stage_of[n] = 0 if n.op == "placeholder" else stage
        if n.op == "call_module" and n.target in cuts:
            stage += 1
    num = stage + 1
    stage_of[nodes[-1]] = num - 1
    live: List[List[fx.Node]] = [[] for _ in range(num)]  # live[k]: inputs of stage k
    for v in nodes:
        if v.op in ("get_attr", "output") or v not in stage_of:
            continue
        last_use = max((stage_of[u] for u in v.users if u in stage_of), default=-1)
        for k in range(stage_of[v] + 1, last_use + 1):
            live[k].append(v)
    hows = {v: _crossing_of(v, k) for k in range(1, num) for v in live[k]}
    return [_stage_module(root_mod, graph, k, num, stage_of, live, hows) for k in range(num)]


def _crossing_of(v: fx.Node, k: int) -> Crossing:
    value = v.meta.get("val")
    how = crossing(value)
    if how is None:
        raise PipelineError(
            f"value '{v.name}' ({type(value).__name__}) crosses the cut before stage {k}",
            call="cut_pipeline_stage()",
            hint="only tensors, None, numbers, shapes and tuples/lists/dicts of them can cross "
            "a cut; move the cut")
    return how


def _stage_module(root: nn.Module, graph: fx.Graph, k: int, num: int,
                  stage_of: Dict[fx.Node, int], live: List[List[fx.Node]],
                  hows: Dict[fx.Node, Crossing]) -> fx.GraphModule:
    g = fx.Graph()
    env: Dict[fx.Node, Any] = {}
    received: Dict[fx.Node, List[fx.Node]] = {}  # value -> the placeholders carrying it
    taken = {v.name for v in live[k]}

    def get(x: fx.Node) -> Any:
        if x not in env and x.op == "get_attr":  # parameters are local to every stage using them
            env[x] = g.node_copy(x)
        return env[x]

    def fresh(name: str) -> str:
        i = 0
        while f"{name}_{i}" in taken:
            i += 1
        taken.add(f"{name}_{i}")
        return f"{name}_{i}"

    for v in live[k] if k > 0 else []:
        how = hows[v]
        if how.kind == "none":
            env[v], received[v] = None, []
        elif how.kind == "tree":
            received[v] = [g.placeholder(fresh(v.name)) for _ in range(how.num_tensors)]
            env[v] = g.call_function(RebuildTree(v.name, how), tuple(received[v]))
        else:
            received[v] = [g.placeholder(v.name)]
            env[v] = received[v][0] if how.kind == "tensor" else \
                g.call_function(unpack_value, (received[v][0], how.kind))
    for n in graph.nodes:
        if stage_of.get(n) != k or n.op == "output" and k != num - 1:
            continue
        if n.op == "output":
            g.output(map_arg(n.args[0], get))
            continue
        env[n] = g.node_copy(n, get)
    if k < num - 1:
        outs: List[fx.Node] = []
        for v in live[k + 1]:
            how = hows[v]
            if v in received:  # only passing through: forward the received tensors
                outs += received[v]
            elif how.kind == "tree":
                flat = g.call_function(FlattenTree(v.name, how), (get(v),))
                outs += [g.call_function(operator.getitem, (flat, i))
                         for i in range(how.num_tensors)]
            elif how.kind != "none":
                outs.append(get(v) if how.kind == "tensor" else
                            g.call_function(pack_value, (get(v),)))
        g.output(tuple(outs))
    for v in received:  # values only passed through are not rebuilt
        if isinstance(env[v], fx.Node) and env[v].op != "placeholder" and not env[v].users:
            g.erase_node(env[v])
    gm = fx.GraphModule(root, g, class_name=f"PipelineStage{k}")
    _keep_non_persistent(root, gm)
    gm.meta["slapo_stage"] = {"index": k, "num_stages": num,
                              "inputs": [v.name for v in live[k]] if k else None}
    return gm


def _keep_non_persistent(root: nn.Module, gm: fx.GraphModule) -> None:
    """Buffers that are not in the root's ``state_dict`` (tensors created while tracing, HF's
    non-persistent masks) stay out of the stage's: ``GraphModule`` registers every buffer it
    copies as persistent."""
    for n in gm.graph.nodes:
        if n.op != "get_attr":
            continue
        owner, _, name = n.target.rpartition(".")
        src = root.get_submodule(owner)
        if name in src._non_persistent_buffers_set:
            gm.get_submodule(owner)._non_persistent_buffers_set.add(name)
