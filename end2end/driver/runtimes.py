"""One runner per benchmark mode, all with the same API: ``runner.train_step(batch) -> loss``.

``make_runner(mode, model_or_config, ...)`` builds the model of a mode on this rank and returns a
:class:`Runner`; the benchmark driver feeds every mode the same HuggingFace-style batches
(``input_ids``, ``attention_mask``, ``labels``) and times ``train_step``. What a mode is (its
framework, layout, precision, what it accepts) is its entry in the table of modes
(:mod:`end2end.spec.modes`); how it is built is the builder it registers with :func:`builds`
(:mod:`end2end.driver.builders`: one small function per framework). The baselines that train
the HF model go through the same path as their Slapo counterparts with an empty schedule
(``slapo.build(target=...)``), so a pair differs only in its schedule.

Low precision (``dtype`` bf16/fp16): modes with ``mixed_precision`` keep fp32 master weights and
fp32 optimizer states: DeepSpeed and FSDP2 are given the fp32 model and cast their compute copy
themselves; ``megatron`` and ``slapo-megatron`` train the model cast to ``dtype`` under
megatron-core's ``Float16OptimizerWithFloat16Params`` (fp32 masters, fp16 with Megatron-LM's
dynamic loss scaling: :mod:`end2end.driver.megatron_optimizer`), as Megatron-LM does. The others
train the model cast to ``dtype`` with the optimizer's states in ``dtype`` (pure low precision),
unless the run asks for ``fp32_masters``: then ``eager``, ``slapo`` and ``slapo-auto`` keep them
as the megatron modes do (the way apex's O2 trains a plain-PyTorch model; NVIDIA's BERT runs).

**Pipelines** (``pipeline_parallel`` > 1, the modes with a ``pipeline_target``: ``slapo`` and
``slapo-deepspeed``): the schedule must cut the model into that many stages (the driver passes
the recipe's ``pipeline_cuts``/``example_inputs`` knobs, see :mod:`end2end.driver.pipeline_plan`);
its group is this rank's block of ``tensor_parallel`` consecutive ranks (one-rank groups for
TP 1), and the build lays the world out as TP x DP x PP. ``slapo`` trains with the torch pipeline
dialect (``PipelineModel.train_step``, ``num_microbatches`` micro-batches, GPipe),
``slapo-deepspeed`` with DeepSpeed's ``PipelineEngine.train_batch`` (the DeepSpeed config gives
the micro-batches; ZeRO stage 0/1).

Every mode uses the same optimizer (default AdamW, lr 1.5e-4, as the artifact's Megatron runs).
Schedules (kernels, sharding, checkpointing) come from ``schedule``: a callable ``fn(sch)``, or a
:class:`ModelSchedule` naming a recipe of :mod:`slapo.model_schedule` and its knobs (the
benchmark driver's choice; the recipe gets the mode's tensor-parallel group, its
``schedule_group``: megatron's for ``slapo-megatron``, the world for ``slapo``, a one-rank group
for ``slapo-deepspeed`` without a pipeline, which is ZeRO-3 without TP; a pipeline's TP block
in both pipelined modes). Activation checkpointing of the Slapo modes
is the schedule's business, ``ckpt`` only affects the baselines.

The pieces are in three modules without a circle: :mod:`end2end.driver.runner` (what every
builder shares: :class:`Runner`, :class:`RunnerRequest`, the registry :func:`builds` and
:class:`Builders`), :mod:`end2end.driver.builders` (the builders) and this one
(:func:`make_runner`, :func:`default_builders`), which re-exports the first's names.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Dict, Optional, Union

import torch
from torch import nn

from slapo.errors import ConfigError
from slapo.runtime.distributed import init_distributed

from end2end.driver import builders as _builders  # registers the builders (explicit import)
from end2end.driver.runner import (BUILDERS, Batch, Builder, Builders, FP32Masters,
                                   ModelSchedule, PipelineBuilder, Runner, RunnerRequest,
                                   ScheduleFn, builds, config_of, default_deepspeed_config,
                                   default_optimizer, hf_model_from_config, prepare_hf_model,
                                   schedule_group, scheduled_model, with_fp32_masters)
from end2end.spec.modes import MODES, get_mode

__all__ = ["MODES", "Runner", "RunnerRequest", "ModelSchedule", "BUILDERS", "Builders", "builds",
           "make_runner", "default_builders", "hf_model_from_config", "default_optimizer",
           "default_deepspeed_config", "config_of", "prepare_hf_model", "scheduled_model",
           "schedule_group", "Batch", "Builder", "PipelineBuilder", "with_fp32_masters"]


def default_builders() -> Builders:
    """The driver's builder table: every mode's registered builder (:func:`builds`, a read-only
    view) and :func:`end2end.driver.builders.pipeline_runner` for pipelines."""
    return Builders(MappingProxyType(BUILDERS), _builders.pipeline_runner)


def make_runner(
    mode: str,
    model_or_config: Union[str, Any, nn.Module],
    *,
    schedule: Optional[Union[ScheduleFn, ModelSchedule]] = None,
    ckpt: Union[bool, str, None] = None,
    optimizer: Callable[[Any], torch.optim.Optimizer] = default_optimizer,
    deepspeed_config: Optional[Dict[str, Any]] = None,
    num_microbatches: int = 1,
    seed: int = 0,
    dtype: Optional[torch.dtype] = None,
    tensor_parallel: Optional[int] = None,
    pipeline_parallel: int = 1,
    builders: Optional[Builders] = None,
) -> Runner:
    """Build ``mode``'s model on this rank (see the module docstring) with the builder the mode
    registered (:func:`builds`).

    Args:
        model_or_config: a transformers config or a model name of the zoo
            (``end2end.models``, e.g. ``"gpt2-medium"``); the modes that train the HF model
            also take a built HF model.
        schedule: the Slapo schedule of the Slapo modes: ``fn(sch)`` or a
            :class:`ModelSchedule` (ignored by the baselines).
        ckpt: activation checkpointing of the baselines: truthy for HF gradient checkpointing
            (``deepspeed``, ``eager``, ``fsdp``, ``dtensor-tp``), ``"full"``/``"selective"``
            for megatron's recomputation.
        optimizer: factory ``fn(params)``, the same in every mode;
            ``with_fp32_masters(factory)`` asks for fp32 master weights in a low ``dtype``
            (:func:`~end2end.driver.runner.with_fp32_masters`).
        deepspeed_config: DeepSpeed config of the ``*deepspeed`` modes (default ZeRO-3).
        num_microbatches: micro-batches per step: a pipeline's, or gradient accumulation
            (every mode; :func:`~end2end.driver.builders.plain_torch_step`).
        seed: weights are drawn after ``torch.manual_seed(seed)``.
        dtype: training precision (default fp32). Modes with
            :attr:`~end2end.spec.modes.Mode.mixed_precision` keep fp32 master weights (in the
            runtime, or in megatron-core's optimizer); the others train the model cast to
            ``dtype`` (pure low precision).
        tensor_parallel: TP size of the modes that take one (default: the world size for the
            modes whose default layout is TP and for pipelines, else 1: ``slapo-fsdp`` is
            FSDP2 alone; T > 1: TP over blocks of T consecutive ranks x FSDP over the rest).
        pipeline_parallel: number of pipeline stages (modes with a pipeline target; the
            schedule must cut that many stages, see the module docstring).
        builders: the builder table to build with (default :func:`default_builders`); the
            simulator passes one whose ZeRO-3 and pipeline builders are its models.

    Raises:
        ConfigError: an unknown mode; pipeline stages in a mode without pipelines, or a
            schedule that does not cut the model into ``pipeline_parallel`` stages;
            fp32 masters asked for in a mode or pipeline that cannot keep them.
    """
    try:
        info = get_mode(mode)
    except ConfigError as exc:
        raise ConfigError(exc.what, call="make_runner", hint=exc.hint) from None
    if pipeline_parallel > 1 and not info.pipeline_enabled:
        raise ConfigError(f"mode {mode!r} cannot run {pipeline_parallel} pipeline stages",
                          call="make_runner", hint="pipelines run in modes "
                          f"{', '.join(repr(m) for m in MODES if get_mode(m).pipeline_enabled)}"
                          "; see end2end.driver.pipeline_plan")
    if isinstance(optimizer, FP32Masters):
        info.check_fp32_masters(pipeline_parallel)
    env = init_distributed()
    tp = tensor_parallel or (env.world_size // pipeline_parallel
                             if info.tp_default or pipeline_parallel > 1 else 1)
    request = RunnerRequest(info, model_or_config, schedule, ckpt, optimizer, deepspeed_config,
                            num_microbatches, seed, dtype, tp, pipeline_parallel, env)
    table = builders or default_builders()
    if pipeline_parallel > 1:
        return table.pipeline(request, scheduled_model(request))
    return table.modes[mode](request)
