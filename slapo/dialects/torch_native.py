"""The ``torch`` target: the scheduled model as a plain ``nn.Module``; with pipeline cuts, a
:class:`~slapo.dialects.torch_pipeline.PipelineModel` running this rank's stage."""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import torch
from torch import nn

from ..errors import BuildError
from .common import has_pipeline_cuts, reject_pipeline_options
from .registry import Dialect, register_dialect


@register_dialect
class TorchDialect(Dialect):
    """``build(sch, optimizer=None)`` -> ``(model, optimizer_or_None)``; ``optimizer`` may be a
    factory ``fn(params) -> Optimizer``.

    With pipeline cuts: ``build(sch, optimizer=None, n_microbatches=1, pipeline_schedule="gpipe",
    loss_fn=None)`` -> ``(PipelineModel, optimizer)`` (default optimizer: AdamW); see
    :mod:`slapo.dialects.torch_pipeline`. The pipeline options are refused without cuts.
    """

    name = "torch"
    options = ("optimizer", "n_microbatches", "pipeline_schedule", "loss_fn")

    def build(
        self, sch, model: nn.Module, optimizer: Optional[Callable[..., Any]] = None,
        n_microbatches: Optional[int] = None, pipeline_schedule: Optional[str] = None,
        loss_fn: Optional[Callable[[Any], torch.Tensor]] = None,
    ) -> Tuple[Any, Optional[torch.optim.Optimizer]]:
        if has_pipeline_cuts(sch):
            from .torch_pipeline import build_torch_pipeline

            return build_torch_pipeline(sch, model, optimizer=optimizer,
                                        n_microbatches=n_microbatches,
                                        pipeline_schedule=pipeline_schedule, loss_fn=loss_fn)
        reject_pipeline_options(self.name, n_microbatches=n_microbatches,
                                pipeline_schedule=pipeline_schedule, loss_fn=loss_fn)
        if optimizer is None:
            return model, None
        if not callable(optimizer):
            raise BuildError("optimizer must be a factory fn(params) -> Optimizer",
                             call="build", hint="e.g. optimizer=lambda p: torch.optim.AdamW(p)")
        params = [p for p in model.parameters() if p.requires_grad]
        return model, optimizer(params)
