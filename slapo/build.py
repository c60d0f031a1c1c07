"""``build``: turn a schedule into a runnable model for a training runtime."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from .dialects import get_dialect
from .errors import BuildError
from .weights.delayed_init import InitFn, materialize
from .sharding.grad_all_reduce import install_grad_hooks
from .schedule import Schedule

__all__ = ["build"]


def build(
    sch: Schedule,
    target: Optional[str] = None,
    init_weights: InitFn = None,
    device: Optional[torch.device] = None,
    init_seed: int = 0,
    **kwargs: Any,
) -> Tuple[Any, Optional[Any]]:
    """Build the scheduled model.

    Args:
        sch: the schedule (usually the root returned by ``create_schedule``).
        target: ``None``/``"torch"`` for a plain ``nn.Module``; other registered dialects
            (``slapo.dialects.list_dialects()``) wrap it into their runtime.
        init_weights: how to initialise tensors still on the meta device: ``True`` for the
            modules' own initialisers, or ``fn(module)`` / ``fn(module, path)``. Only this rank's
            shards are allocated. Real tensors are never re-initialised.
        device: where meta tensors are materialised (default: CUDA when available, else CPU).
        init_seed: base seed of delayed initialisation; the module at ``path`` is initialised
            under ``module_seed(init_seed, path)``, so values do not depend on the tensor-parallel
            degree (see :func:`slapo.weights.delayed_init.materialize`).
        **kwargs: options of the target (e.g. ``optimizer=`` for ``torch``; with pipeline cuts
            also ``n_microbatches=``, ``pipeline_schedule=``, ``loss_fn=``).

    Returns:
        ``(model, optimizer_or_None)``; ``model`` is an ordinary ``nn.Module`` for ``torch``.
        With pipeline cuts (``cut_pipeline_stage``): ``torch`` gives a
        :class:`~slapo.dialects.torch_pipeline.PipelineModel` running this rank's stage
        (``train_step(batch)``), ``deepspeed`` a DeepSpeed pipeline engine over a
        ``PipelineModule`` (``train_batch``); the world is laid out as tensor x data x pipeline
        parallelism (:mod:`slapo.dialects.layout`).

    Raises:
        BuildError: not a schedule, unknown target, or an option the target does not take.
        InitError: meta tensors remain and ``init_weights`` does not say how to fill them.
    """
    if not isinstance(sch, Schedule):
        raise BuildError(f"expected a Schedule, got {type(sch).__name__}", call="build",
                         hint="pass the object returned by slapo.create_schedule(model)")
    dialect = get_dialect(target, path=sch.path)
    unknown = sorted(set(kwargs) - set(dialect.options))
    if unknown:
        raise BuildError(
            f"target '{dialect.name}' does not take option(s) {', '.join(unknown)}",
            call="build", path=sch.path,
            hint=f"its options are: {', '.join(dialect.options) or 'none'}",
        )
    model = materialize(sch, init_weights, device=device, seed=init_seed)
    install_grad_hooks(model)  # all_reduce_grads hooks of parameters materialize re-created
    return dialect.build(sch, model, **kwargs)
