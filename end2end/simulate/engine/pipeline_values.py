"""Ints and shapes a simulated pipeline stage receives packed in tensors, with their values.

A traced model passes plain values from layer to layer: GPT-2 and GPT-Neo compute
``output_shape = (-1,) + input_shape[1:] + (hidden,)`` before the first block and use it after
the last one. Across a pipeline cut such a value travels packed into a small ``int64`` tensor
(:func:`slapo.pipeline.values.pack_value`) that the receiving stage unpacks
(``unpack_value``, :class:`~slapo.pipeline.values.RebuildTree`). In simulation the tensors a
stage receives are the runtime's receive buffers, which the fake process group never fills:
fake tensors without data, whose entries read as 1 (:mod:`end2end.simulate.engine.recorder`), so a
GPT-2 stage after a cut viewed its output as ``[1, 1, 1]`` and failed.

A real stage learns these values by receiving them. A simulated one learns them as the
runtime's own first step lets it: :class:`slapo.pipeline.runner.PipelineRunner` runs the stages
before this rank's once, in this process, on one micro-batch, to derive the stage's example
inputs; there the packed values are small constants that fake mode keeps
(:mod:`end2end.simulate.engine.fake_world`). :func:`remember_packed_values` makes every unpacking
node
of the stage's graph keep the packed tensors it saw carrying values and use them in place of
received ones that carry none. Every micro-batch has the shapes of the first, so these are the
values a real stage receives. Only the simulated process's copy of the stage changes: a packed
tensor with a value (a real one, or a fake constant) is always used as it is.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence

import torch
from torch import fx

__all__ = ["KnownPackedValues", "remember_packed_values", "carries_value"]


def carries_value(t: Any) -> bool:
    """Whether reading ``t``'s entries gives its values: a real tensor, or a fake tensor whose
    value fake mode knows (a constant); a fake receive buffer does not."""
    from torch._subclasses.fake_tensor import FakeTensor

    return not isinstance(t, FakeTensor) or t.constant is not None


class KnownPackedValues:
    """A graph function unpacking values received packed in tensors (``target``), whose packed
    arguments (positions ``packed``) are replaced, when they carry no value, by the last ones
    seen carrying one (module docstring).

    Raises:
        RuntimeError: a packed argument carries no value and none was seen before: the stage
            ran without the runtime's first, in-process pass over the stages before it.
    """

    def __init__(self, target: Callable[..., Any], packed: Sequence[int], name: str):
        self.target, self.packed, self.name = target, tuple(packed), name
        self.known: Dict[int, torch.Tensor] = {}
        self.__name__ = f"known_{getattr(target, '__name__', 'unpack')}"

    def __call__(self, *args: Any) -> Any:
        args_list = list(args)
        for i in self.packed:
            if carries_value(args_list[i]):
                self.known[i] = args_list[i]
            elif i in self.known:
                args_list[i] = self.known[i]
            else:
                raise RuntimeError(
                    f"pipeline value '{self.name}' arrived packed in a fake tensor without a "
                    "value, and the stage never saw it with one (end2end/simulate/"
                    "pipeline_values.py: run the stages before it in this process first)")
        return self.target(*args_list)

    def __repr__(self) -> str:
        return f"KnownPackedValues({self.name!r})"


def _packed_positions(node: fx.Node) -> List[int]:
    """Positions of the packed arguments of an unpacking node, [] for any other node."""
    from slapo.pipeline.values import RebuildTree, unpack_value

    if node.op != "call_function":
        return []
    if node.target is unpack_value:
        return [0]
    if isinstance(node.target, RebuildTree):
        sent = [kind for kind in node.target.how.leaves if kind != "const"]
        return [i for i, kind in enumerate(sent) if kind != "tensor"]
    return []


def remember_packed_values(stage: torch.nn.Module) -> int:
    """Rewrite ``stage`` (a pipeline stage's ``GraphModule``) so that its unpacking nodes know
    the values of packed tensors (module docstring); returns how many nodes were rewritten."""
    graph = getattr(stage, "graph", None)
    if not isinstance(graph, fx.Graph):
        return 0
    changed = 0
    for node in graph.nodes:
        packed = _packed_positions(node)
        if packed:
            name = getattr(node.target, "name", None) or node.args[0].name  # the value's name
            node.target = KnownPackedValues(node.target, packed, name)
            changed += 1
    if changed:
        stage.recompile()
    return changed
