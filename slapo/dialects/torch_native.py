"""The ``torch`` target: the scheduled model as a plain ``nn.Module``."""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import torch
from torch import nn

from ..errors import BuildError
from .registry import Dialect, register_dialect


@register_dialect
class TorchDialect(Dialect):
    """Returns the model itself; ``optimizer`` may be a factory ``fn(params) -> Optimizer``."""

    name = "torch"
    options = ("optimizer",)

    def build(
        self, sch, model: nn.Module, optimizer: Optional[Callable[..., Any]] = None
    ) -> Tuple[nn.Module, Optional[torch.optim.Optimizer]]:
        if optimizer is None:
            return model, None
        if not callable(optimizer):
            raise BuildError("optimizer must be a factory fn(params) -> Optimizer",
                             call="build", hint="e.g. optimizer=lambda p: torch.optim.AdamW(p)")
        params = [p for p in model.parameters() if p.requires_grad]
        return model, optimizer(params)
