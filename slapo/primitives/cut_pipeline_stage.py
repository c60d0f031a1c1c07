"""``cut_pipeline_stage``: end a pipeline stage after this module."""

from __future__ import annotations

import torch.fx as fx
from torch import nn

from ..errors import PipelineError
from ..pipeline.stages import CUTS_KEY
from .module_checks import format_call
from .registry import Primitive, register_primitive

__all__ = ["CutPipelineStage"]


@register_primitive
class CutPipelineStage(Primitive):
    name = "cut_pipeline_stage"

    @staticmethod
    def apply(sch) -> None:
        """Make this module the last one of a pipeline stage.

        The parent must be traced (``sch.trace_until(parent_path)`` traces it and everything
        above it), because stages are cut out of the graph. Stages are built by
        :func:`slapo.pipeline.build_pipeline_stages`; they keep the original parameter paths.

        Before: one stage. After: one more stage boundary, recorded at the root.

        Raises:
            PipelineError: called on the root; the parent is not traced; the parent's graph
                does not call this module; the module is already a cut.
        """
        call = format_call("cut_pipeline_stage")
        if sch.parent is None:
            raise PipelineError("the root module cannot end a stage", path=sch.path, call=call,
                                module=sch.mod, hint="cut after one of its submodules")
        owner = sch.parent  # the module whose forward calls this one (skipping containers)
        while isinstance(owner.mod, (nn.ModuleList, nn.ModuleDict)) and owner.parent is not None:
            owner = owner.parent
        parent = owner.mod
        if not isinstance(parent, fx.GraphModule):
            raise PipelineError(
                f"the parent '{owner.path or '<root>'}' is not traced", path=sch.path,
                call=call, module=sch.mod,
                hint=f"call sch.trace_until({owner.path!r}, example_inputs=...) first")
        rel = sch.path[len(owner.path) + 1:] if owner.path else sch.path
        called = [n for n in parent.graph.nodes if n.op == "call_module" and n.target == rel]
        if not called:
            raise PipelineError("the traced parent does not call this module", path=sch.path,
                                call=call, module=sch.mod,
                                hint="cut after a module the parent's forward calls")
        cuts = sch.root.metadata.setdefault(CUTS_KEY, [])
        if sch.path in cuts:
            raise PipelineError("already a cut", path=sch.path, call=call, module=sch.mod,
                                hint="cut once per stage boundary")
        cuts.append(sch.path)
        sch.metadata[CUTS_KEY] = True
