"""``decompose``: split an ``nn.Linear`` into matmul + a separate bias add.

The bias add then shows up as its own node in a traced parent, so it can join a following
fusion (bias + GeLU, bias + dropout + residual ...).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ..errors import PrimitiveError
from .module_checks import format_call
from .registry import Primitive, register_primitive

__all__ = ["Decompose", "LinearWithSeparateBias"]


class LinearWithSeparateBias(nn.Linear):
    """``F.linear(x, weight) + bias``; tracers inline it (``_slapo_inline``) so the bias add
    is a node of the parent's graph. Reuses the original Parameter objects."""

    _slapo_inline = True

    @classmethod
    def from_linear(cls, old: nn.Linear) -> "LinearWithSeparateBias":
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = old.in_features, old.out_features
        new.weight, new.bias = old.weight, old.bias
        new.train(old.training)
        return new

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.weight) + self.bias


@register_primitive
class Decompose(Primitive):
    name = "decompose"

    @staticmethod
    def apply(sch) -> LinearWithSeparateBias:
        """Replace this ``nn.Linear`` by :class:`LinearWithSeparateBias` (same parameters,
        same paths). If the parent is already traced, its ``call_module`` node is expanded in
        place into ``linear(x, weight)`` + ``add(bias)``; otherwise the next trace of the
        parent inlines it.

        Raises:
            PrimitiveError: not an ``nn.Linear``; no bias; already sharded (decompose before
                ``shard``); hooks on the module while its traced parent would bypass them.
        """
        call = format_call("decompose")
        mod = sch.mod
        if isinstance(mod, LinearWithSeparateBias):
            raise PrimitiveError("already decomposed", path=sch.path, call=call, module=mod,
                                 hint="call decompose() once")
        if not isinstance(mod, nn.Linear):
            raise PrimitiveError(f"only nn.Linear can be decomposed, not {type(mod).__name__}",
                                 path=sch.path, call=call, module=mod,
                                 hint="decompose the Linear layers themselves")
        if mod.bias is None:
            raise PrimitiveError("the Linear has no bias to separate", path=sch.path,
                                 call=call, module=mod, hint="nothing to decompose")
        if getattr(mod.weight, "slapo_shard", None) is not None or tuple(mod.weight.shape) != (
                mod.out_features, mod.in_features):
            raise PrimitiveError("the Linear is already sharded", path=sch.path, call=call,
                                 module=mod, hint="call decompose() before shard()")
        parent = sch.parent.mod if sch.parent is not None else None
        if not isinstance(parent, fx.GraphModule):
            parent = None  # not traced: the next trace inlines the decomposed Linear
        sites = [n for n in parent.graph.nodes if n.op == "call_module" and n.target == sch.name
                 ] if parent is not None else []
        if sites and (mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks):
            raise PrimitiveError("the module has hooks that the expanded graph would bypass",
                                 path=sch.path, call=call, module=mod,
                                 hint="decompose before registering hooks or tracing the parent")
        new = LinearWithSeparateBias.from_linear(mod)
        sch.swap_module(new)
        for node in sites:
            assert parent is not None  # sites come from its graph
            g = parent.graph
            x = node.args[0] if node.args else node.kwargs["input"]
            with g.inserting_before(node):
                w = g.get_attr(f"{sch.name}.weight")
                b = g.get_attr(f"{sch.name}.bias")
                mm = g.call_function(F.linear, (x, w))
                out = g.call_function(operator.add, (mm, b))
            node.replace_all_uses_with(out)
            g.erase_node(node)
        if parent is not None and sites:
            parent.graph.lint()
            parent.recompile()
        sch.metadata["decompose"] = True
        return new
