"""The ``torch`` target for schedules with pipeline cuts: :class:`PipelineModel`.

``build(sch)`` (target ``None``/``"torch"``) on a schedule with ``cut_pipeline_stage`` marks
returns ``(PipelineModel, optimizer)``. Every rank builds the same schedule; the world is laid out
as tensor x data x pipeline parallelism (:mod:`slapo.dialects.layout`): the tensor-parallel group
is the schedule's (none: TP 1), there are as many stages as cuts + 1, and the remaining factor is
data parallelism. Each rank trains its stage with ``torch.distributed.pipelining``
(:class:`slapo.pipeline.PipelineRunner`, GPipe or 1F1B)::

    model, opt = slapo.build(sch, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                             n_microbatches=4, pipeline_schedule="1f1b")
    loss = model.train_step(batch)   # same call on every rank

Options (pipeline only): ``n_microbatches`` (default 1), ``pipeline_schedule`` (``"gpipe"``,
default, or ``"1f1b"``), ``loss_fn`` (``fn(last stage output) -> scalar``, default the output's
``loss``, i.e. a HuggingFace model given ``labels``), ``optimizer`` (a factory ``fn(params)`` or an
optimizer; default ``torch.optim.AdamW``), over this rank's stage parameters only.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError
from ..pipeline import build_pipeline_stages
from ..pipeline.runner import PipelineRunner, _model_loss
from .common import OptimizerArg, make_optimizer, pipeline_groups
from .layout import LayoutGroups

__all__ = ["PipelineModel", "build_torch_pipeline"]

Batch = Dict[str, torch.Tensor]


class PipelineModel:
    """One rank's part of a pipelined model, model-like (not an ``nn.Module``).

    Attributes:
        module: this rank's stage, a ``GraphModule`` whose parameters keep the original paths
            (``transformer.h.2.mlp.c_fc.weight``); ``parameters()``, ``named_parameters()``,
            ``state_dict()``, ``load_state_dict()``, ``train()``/``eval()`` act on it.
        stages: every stage; the ones before this rank's run once, at the first step (or in
            :meth:`prepare`), to derive the values sent into it, then every other stage's
            parameters and buffers are released (emptied: only this rank's stage stays in
            memory, weights it ties to other stages included).
        stage_index / num_stages: this rank's stage and their number.
        groups: the layout and this rank's pipeline / data-parallel groups.
        optimizer: the optimizer over ``module``'s parameters.
        tp_group: the schedule's tensor-parallel group (``None``: TP 1).
        config: the model's configuration (a HuggingFace ``config``; ``None`` for others), for
            :func:`slapo.export_pretrained`.
    """

    config: Any = None

    def __init__(self, stages: List[nn.Module], groups: LayoutGroups,
                 optimizer: torch.optim.Optimizer, *, n_microbatches: int, schedule: str,
                 loss_fn: Callable[[Any], torch.Tensor], tp_group: Optional[dist.ProcessGroup],
                 device: torch.device):
        self.stages, self.groups, self.optimizer = stages, groups, optimizer
        self.stage_index = groups.coords.stage
        self.num_stages = len(stages)
        self.module = stages[self.stage_index]
        self.n_microbatches = n_microbatches
        self.tp_group = tp_group if groups.layout.tp > 1 else None
        self.device = device
        self._last_stage_rank = groups.pp_ranks[-1]
        self.runner = PipelineRunner(stages, n_microbatches, schedule=schedule,
                                     stage_index=self.stage_index, group=groups.pp_group,
                                     loss_of=loss_fn, tie_group_fn=groups.tie_group,
                                     device=device, release_others=True)

    # ------------------------------------------------------------------ nn.Module-like
    def parameters(self) -> Iterator[nn.Parameter]:
        return self.module.parameters()

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[Tuple[str, nn.Parameter]]:
        return self.module.named_parameters(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.module.load_state_dict(*args, **kwargs)

    def train(self, mode: bool = True) -> "PipelineModel":
        for st in self.stages:
            st.train(mode)
        return self

    def eval(self) -> "PipelineModel":
        return self.train(False)

    # ------------------------------------------------------------------ training
    def prepare(self, batch: Batch) -> Any:
        """Build this rank's pipeline schedule ahead of the first :meth:`train_step`, from a
        batch of the shapes training will use, as the first step would build it (model in
        training mode; :meth:`slapo.pipeline.PipelineRunner.prepare`: the stages before this
        rank's run once, then the other stages are released). Returns the schedule; a second
        call, or a later step, reuses it. Local to the rank: no communication.

        Raises:
            ConfigError: the batch does not split into ``n_microbatches`` equal parts.
        """
        batch = {k: v.to(self.device) for k, v in batch.items()}
        self._check_batch(batch)
        self.train()
        return self.runner.prepare(batch)

    def train_step(self, batch: Batch) -> float:
        """One optimizer step; returns the loss averaged over micro-batches and data-parallel
        replicas, on every rank.

        Every rank passes a batch of the same shapes (keyword inputs of the model, batch first;
        the non-first stages use it only for shapes). The first stage's ranks train on theirs;
        tensor-parallel ranks on their group's first rank's batch. The batch is split into
        ``n_microbatches``; gradients are accumulated over them (mean), summed over the stages
        sharing a tied parameter, averaged over data-parallel replicas; then the optimizer steps.
        The first step builds the pipeline schedule unless :meth:`prepare` did.

        Raises:
            ConfigError: the batch does not split into ``n_microbatches`` equal parts.
        """
        batch = self._broadcast_tp({k: v.to(self.device) for k, v in batch.items()})
        self._check_batch(batch)
        self.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.runner.step(batch)
        self._reduce_data_parallel_grads()
        self.optimizer.step()
        out = torch.zeros((), device=self.device) if loss is None else loss.detach().reshape(())
        pp_group, dp_group = self.groups.pp_group, self.groups.dp_group
        dist.broadcast(out, src=self._last_stage_rank, group=pp_group)
        if self.groups.layout.dp > 1:
            dist.all_reduce(out, op=dist.ReduceOp.AVG, group=dp_group)
        return out.item()

    def _check_batch(self, batch: Batch) -> None:
        sizes = {v.shape[0] for v in batch.values() if v.dim() > 0}
        if len(sizes) != 1 or next(iter(sizes)) % self.n_microbatches:
            raise ConfigError(
                f"cannot split a batch with leading sizes {sorted(sizes)} into "
                f"{self.n_microbatches} micro-batches", call="train_step",
                hint="use a batch size that is a multiple of n_microbatches")

    def _broadcast_tp(self, batch: Batch) -> Batch:
        if self.tp_group is None:
            return batch
        src = dist.get_process_group_ranks(self.tp_group)[0]
        out = {}
        for key in sorted(batch):
            t = batch[key].clone(memory_format=torch.contiguous_format)  # never the caller's
            dist.broadcast(t, src=src, group=self.tp_group)
            out[key] = t
        return out

    def _reduce_data_parallel_grads(self) -> None:
        if self.groups.layout.dp == 1:
            return
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=self.groups.dp_group)
        for g, r in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            g.copy_(r)


def build_torch_pipeline(sch, model: nn.Module, *, optimizer: OptimizerArg,
                         n_microbatches: Optional[int], pipeline_schedule: Optional[str],
                         loss_fn: Optional[Callable[[Any], torch.Tensor]],
                         ) -> Tuple[PipelineModel, torch.optim.Optimizer]:
    """``build(sch, target="torch")`` for a schedule with pipeline cuts (module docstring).

    Raises:
        ConfigError: ``n_microbatches`` is not a positive int, or an unknown schedule.
        BuildError: the world does not fit the stages (see ``common.pipeline_groups``).
        PipelineError: the stages cannot be built (see ``build_pipeline_stages``).
    """
    from ..runtime.distributed import init_distributed

    n_micro = 1 if n_microbatches is None else n_microbatches
    if not isinstance(n_micro, int) or isinstance(n_micro, bool) or n_micro < 1:
        raise ConfigError(f"n_microbatches must be a positive int, got {n_microbatches!r}",
                          call="build", hint="e.g. n_microbatches=4")
    schedule = (pipeline_schedule or "gpipe").lower()
    if schedule not in ("gpipe", "1f1b"):
        raise ConfigError(f"unknown pipeline_schedule {pipeline_schedule!r}", call="build",
                          hint="use 'gpipe' or '1f1b'")
    stages = build_pipeline_stages(sch)
    env = init_distributed()
    groups = pipeline_groups(sch, model, len(stages), "torch")
    stages[groups.coords.stage].to(env.device)  # the others visit it once (PipelineRunner)
    opt = make_optimizer(stages[groups.coords.stage], optimizer)
    runtime = PipelineModel(stages, groups, opt, n_microbatches=n_micro, schedule=schedule,
                            loss_fn=loss_fn or _model_loss, tp_group=sch.group,
                            device=env.device)
    runtime.config = getattr(model, "config", None)
    return runtime, opt
