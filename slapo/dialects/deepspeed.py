"""The ``deepspeed`` target: the scheduled model inside a DeepSpeed engine (ZeRO 0-3).

``build(sch, target="deepspeed", config={...})`` returns ``(engine, optimizer)``. Train with
DeepSpeed's usual loop::

    loss = engine(**batch).loss
    engine.backward(loss)
    engine.step()

* ``config``: the DeepSpeed config dict (ZeRO stage, batch sizes, precision ...). When it names
  neither ``train_batch_size`` nor ``train_micro_batch_size_per_gpu``, a micro-batch of 1 is assumed
  (it only matters for DeepSpeed's throughput logging; the batch you feed is what is trained).
  DeepSpeed 0.19 clips gradients at norm 1.0 unless the config sets ``gradient_clipping: 0``.
  On tiny models ZeRO-3 keeps small parameters whole unless
  ``zero_optimization.stage3_param_persistence_threshold`` is 0.
* ``optimizer``: a torch optimizer or a factory ``fn(params)``. When neither it nor the config's
  ``optimizer`` section is given, ``torch.optim.AdamW`` is used. A config ``Adam``/``AdamW``
  section gets ``torch_adam: true``. Either way no DeepSpeed op is compiled
  (see :mod:`slapo.dialects.compat.deepspeed_startup`).
* ``mpu``: DeepSpeed's model-parallel unit. When the model has tensor-parallel shards and no
  ``mpu`` is given, one is derived from the schedule's group: the tensor-parallel group is
  ``sch.group`` and the data-parallel group (over which ZeRO partitions) is the ranks with the same
  tensor-parallel rank.

Process groups and the device come from :mod:`slapo.runtime.distributed` (gloo on CPU, NCCL on GPU).

With pipeline cuts the model becomes a DeepSpeed ``PipelineModule`` trained with
``engine.train_batch()``; two more options apply: ``loss_fn`` (DeepSpeed's ``fn(outputs, labels)``)
and ``input_names``. See :mod:`slapo.dialects.deepspeed_pipeline`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch.distributed as dist
from torch import nn

from .compat.deepspeed_startup import import_deepspeed, init_deepspeed_comm, no_build_config
from ..runtime.distributed import default_timeout, init_distributed
from ..errors import BuildError
from .common import (
    OptimizerArg,
    data_parallel_group,
    has_pipeline_cuts,
    has_tp_shards,
    make_optimizer,
    reject_pipeline_options,
    tag_tensor_parallel_params,
    tp_ranks,
)
from .registry import Dialect, register_dialect

__all__ = ["DeepSpeedDialect", "TensorParallelMPU"]

_CONFIG_EXAMPLE = ('config={"train_micro_batch_size_per_gpu": 8, '
                   '"zero_optimization": {"stage": 3}}')


class TensorParallelMPU:
    """DeepSpeed's model-parallel unit for a Slapo tensor-parallel model (no pipeline).

    Tensor-parallel group = the schedule's group; data-parallel group = the ranks with the same
    tensor-parallel rank. Creating it is collective over the world.
    """

    def __init__(self, tp_group: Optional[dist.ProcessGroup]):
        self._tp_group = tp_group if tp_group is not None else dist.group.WORLD
        self._tp_ranks = tp_ranks(tp_group)
        self._dp_group = data_parallel_group(tp_group)

    # tensor (= model) parallel
    def get_tensor_model_parallel_group(self) -> dist.ProcessGroup:
        return self._tp_group

    def get_tensor_model_parallel_world_size(self) -> int:
        return len(self._tp_ranks)

    def get_tensor_model_parallel_rank(self) -> int:
        return self._tp_ranks.index(dist.get_rank())

    def get_tensor_model_parallel_src_rank(self) -> int:
        return self._tp_ranks[0]

    get_model_parallel_group = get_tensor_model_parallel_group
    get_model_parallel_world_size = get_tensor_model_parallel_world_size
    get_model_parallel_rank = get_tensor_model_parallel_rank
    get_slice_parallel_group = get_tensor_model_parallel_group
    get_slice_parallel_world_size = get_tensor_model_parallel_world_size
    get_slice_parallel_rank = get_tensor_model_parallel_rank

    # data parallel
    def get_data_parallel_group(self) -> dist.ProcessGroup:
        return self._dp_group

    def get_data_parallel_world_size(self) -> int:
        return dist.get_world_size(self._dp_group)

    def get_data_parallel_rank(self) -> int:
        return dist.get_rank(self._dp_group)

    def get_data_parallel_group_ranks(self) -> list:
        return list(dist.get_process_group_ranks(self._dp_group))

    # no pipeline parallelism
    def get_pipeline_model_parallel_world_size(self) -> int:
        return 1

    def get_pipeline_model_parallel_rank(self) -> int:
        return 0

    get_pipe_parallel_world_size = get_pipeline_model_parallel_world_size
    get_pipe_parallel_rank = get_pipeline_model_parallel_rank


def _with_batch_size(config: Dict[str, Any]) -> Dict[str, Any]:
    if "train_batch_size" not in config and "train_micro_batch_size_per_gpu" not in config:
        config = {**config, "train_micro_batch_size_per_gpu": 1}
    return config


def _pipeline_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """A pipeline config: a batch size, and no activation partitioning over tensor-parallel
    ranks (Slapo stages exchange whole tensors)."""
    config = _with_batch_size(config)
    pipeline = dict(config.get("pipeline") or {})
    pipeline.setdefault("pipe_partitioned", False)
    pipeline.setdefault("grad_partitioned", False)
    return {**config, "pipeline": pipeline}


@register_dialect
class DeepSpeedDialect(Dialect):
    """``build(sch, target="deepspeed", config=..., optimizer=None, mpu=None)`` ->
    ``(engine, optimizer)``; with pipeline cuts also ``loss_fn=None, input_names=None`` (and no
    ``mpu``: the topology comes from the layout); see the module docstring."""

    name = "deepspeed"
    options = ("config", "optimizer", "mpu", "loss_fn", "input_names")

    def build(
        self,
        sch,
        model: nn.Module,
        config: Optional[Dict[str, Any]] = None,
        optimizer: OptimizerArg = None,
        mpu: Any = None,
        loss_fn: Optional[Callable[..., Any]] = None,
        input_names: Optional[Sequence[str]] = None,
    ) -> Tuple[Any, Any]:
        pipelined = has_pipeline_cuts(sch)
        if not pipelined:
            reject_pipeline_options(self.name, loss_fn=loss_fn, input_names=input_names)
        elif mpu is not None:
            raise BuildError("mpu cannot be given for a schedule with pipeline cuts",
                             call="build(target='deepspeed')",
                             hint="drop mpu: the pipeline/data/tensor groups come from the "
                                  "schedule's group and the number of stages")
        if not isinstance(config, dict):
            raise BuildError(
                "target 'deepspeed' needs a DeepSpeed config dict"
                + ("" if config is None else f", got {type(config).__name__}"),
                call="build(target='deepspeed')", hint=f"pass e.g. {_CONFIG_EXAMPLE}")
        if pipelined:
            from .deepspeed_pipeline import build_deepspeed_pipeline

            use_torch_optimizer = optimizer is not None or "optimizer" not in config
            config = _pipeline_config(no_build_config(config, torch_optimizer=use_torch_optimizer))
            return build_deepspeed_pipeline(sch, model, config, optimizer, loss_fn, input_names)
        deepspeed = import_deepspeed()
        env = init_distributed()
        init_deepspeed_comm(env.backend, default_timeout())
        model.to(env.device)
        use_torch_optimizer = optimizer is not None or "optimizer" not in config
        opt = make_optimizer(model, optimizer) if use_torch_optimizer else None
        config = _with_batch_size(no_build_config(config, torch_optimizer=use_torch_optimizer))
        if has_tp_shards(model):
            tag_tensor_parallel_params(model)
            if mpu is None and len(tp_ranks(sch.group)) > 1:
                mpu = TensorParallelMPU(sch.group)
        engine, ds_opt, _, _ = deepspeed.initialize(
            model=model, optimizer=opt,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=config, mpu=mpu, dist_init_required=False,
        )
        return engine, ds_opt
