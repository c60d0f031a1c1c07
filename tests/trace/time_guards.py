"""What the dtype / config / module-flag guards (slapo.trace.baked) cost on a traced layer.

Not a test: ``nice -n 10 python tests/trace/time_guards.py [hidden seq calls repeats]``. Times
the forward of one traced ``BertLayer`` and one ``LlamaDecoderLayer`` (flatten=True, eval mode,
no grad, one thread) with their guards and the same graph with the guards of
:mod:`slapo.trace.baked` removed, interleaved (A, B, A, B ...), and prints the median time per
call of each and their ratio with the min-max range of the per-repeat ratios.
"""

from __future__ import annotations

import copy
import statistics
import sys
import time

import torch
import torch.fx as fx

import slapo
from slapo.testing import tiny_model
from slapo.trace.baked import check_baked, check_tensor_attr


def without_baked_guards(gm: fx.GraphModule) -> fx.GraphModule:
    """The same module with the check_baked / check_tensor_attr nodes erased."""
    graph = copy.deepcopy(gm.graph)
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and node.target in (check_baked, check_tensor_attr):
            graph.erase_node(node)
    for node in reversed(list(graph.nodes)):
        if node.op == "get_attr" and node.target == "_slapo_baked" and not node.users:
            graph.erase_node(node)
    out = fx.GraphModule(gm, graph)
    out._modules.update(gm._modules)
    return out


def _guard_time(gm: fx.GraphModule, args: tuple, kwargs: dict, n: int) -> float:
    """Seconds per call of the guard nodes alone, called as the graph calls them."""
    env = {}
    ph = [p for p in gm.graph.nodes if p.op == "placeholder"]
    for node, value in zip(ph, args):
        env[node] = value
    for node in ph:
        if node.target in kwargs:
            env[node] = kwargs[node.target]
    calls = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (check_baked, check_tensor_attr):
            if node.target is check_baked:
                calls.append((check_baked, (gm._slapo_baked,) + tuple(node.args[1:])))
            elif node.args[0] in env:
                calls.append((check_tensor_attr, (env[node.args[0]],) + tuple(node.args[1:])))
            else:  # an intermediate value: one with the same attribute stands in
                ref = next(iter(env.values()))
                calls.append((check_tensor_attr, (ref,) + tuple(node.args[1:])))
    start = time.perf_counter()
    for _ in range(n):
        for fn, a in calls:
            fn(*a)
    return (time.perf_counter() - start) / n


def _per_call(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


LAYERS = {"bert": "bert.encoder.layer.0", "llama": "model.layers.0"}


def time_layer(family: str, hidden: int, seq: int, calls: int, repeats: int) -> None:
    over = dict(hidden_size=hidden, intermediate_size=4 * hidden, num_attention_heads=4,
                max_position_embeddings=max(64, seq))
    if family == "llama":
        over.update(num_key_value_heads=4, use_cache=False)
    model = tiny_model(family, **over).eval()
    ids = torch.randint(3, 128, (2, seq))
    sch = slapo.create_schedule(model)
    captured = {}
    layer = sch.mod.get_submodule(LAYERS[family])
    handle = layer.register_forward_pre_hook(
        lambda m, a, k: captured.update(args=a, kwargs=k), with_kwargs=True)
    with torch.no_grad():
        model(input_ids=ids)
    handle.remove()
    sch[LAYERS[family]].trace(example_inputs={"input_ids": ids}, flatten=True)
    traced = sch[LAYERS[family]].mod
    bare = without_baked_guards(traced)
    args, kwargs = captured["args"], captured["kwargs"]
    guards = sum(n.target in (check_baked, check_tensor_attr) for n in traced.graph.nodes)

    def first(out):
        return out[0] if isinstance(out, tuple) else out

    with torch.no_grad():
        torch.testing.assert_close(first(traced(*args, **kwargs)), first(bare(*args, **kwargs)))
        a, b = [], []
        for _ in range(repeats):
            a.append(_per_call(lambda: traced(*args, **kwargs), calls))
            b.append(_per_call(lambda: bare(*args, **kwargs), calls))
        guard_only = _guard_time(traced, args, kwargs, calls * 20)
    ratios = [x / y for x, y in zip(a, b)]
    print(f"  the guards alone: {guard_only * 1e6:.2f} us/call = "
          f"{guard_only / statistics.median(b) * 100:.3f}% of the layer's call")
    print(f"{type(layer).__name__} hidden={hidden} seq={seq}: {guards} guard nodes; with guards "
          f"{statistics.median(a) * 1e6:.1f} us/call, without {statistics.median(b) * 1e6:.1f} "
          f"us/call; ratio {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max "
          f"{max(ratios):.3f}) over {repeats} interleaved repeats of {calls} calls")


def main(hidden: int = 64, seq: int = 32, calls: int = 200, repeats: int = 15) -> None:
    torch.set_num_threads(1)
    for family in LAYERS:
        time_layer(family, hidden, seq, calls, repeats)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
