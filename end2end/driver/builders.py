"""The builders of the benchmark modes: one small function per framework, registered for its
modes with :func:`~end2end.driver.runner.builds` (the table of modes, :mod:`end2end.spec.modes`,
says what each mode is; :func:`~end2end.driver.runtimes.make_runner` calls its builder), and the
training step of each runtime. A new mode needs an entry in the table and, unless an existing
builder fits, one function here.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

import slapo
from slapo.errors import ConfigError

from end2end.driver.runner import (Batch, ModelSchedule, Runner, RunnerRequest, builds,
                                   config_of, default_deepspeed_config, prepare_hf_model,
                                   scheduled_model)

__all__ = ["pipeline_runner", "plain_torch_step", "micro_batches"]


def micro_batches(batch: Batch, count: int) -> List[Batch]:
    """``batch`` cut into ``count`` micro-batches of equal size along the batch dimension (every
    input is batch-first); the layout (:func:`end2end.spec.layout.run_layout`) makes the
    rank's batch a multiple of the micro-batch."""
    if count == 1:
        return [batch]
    parts = {k: v.tensor_split(count) for k, v in batch.items()}
    return [{k: chunks[i] for k, chunks in parts.items()} for i in range(count)]


def _deepspeed_step(engine: Any, microbatches: int = 1) -> Callable[[Batch], float]:
    """One optimizer step of a DeepSpeed engine over ``microbatches`` micro-batches (its config's
    ``gradient_accumulation_steps``: the engine scales each loss and steps at the boundary);
    the loss is the micro-batches' mean, averaged over data-parallel ranks."""
    group = getattr(engine, "data_parallel_group", None)

    def step(batch: Batch) -> float:
        total = torch.zeros((), device=engine.device)
        for part in micro_batches(batch, microbatches):
            loss = engine(**{k: v.to(engine.device) for k, v in part.items()}).loss
            engine.backward(loss)
            engine.step()
            total += loss.detach().float() / microbatches
        dist.all_reduce(total, op=dist.ReduceOp.AVG, group=group)
        return total.item()

    return step


def plain_torch_step(model: nn.Module, opt: Any, dp_group: Any = None,
                     microbatches: int = 1) -> Callable[[Batch], float]:
    """The training step of a model on plain PyTorch (also under DDP or FSDP2): a function
    ``step(batch) -> loss`` that zeroes the gradients, runs forward (keyword inputs moved to the
    model's device; the model returns ``.loss``) and backward on each of ``microbatches``
    equal micro-batches of the batch (gradient accumulation: each loss scaled by
    ``1 / microbatches``, so the step's gradient is the whole batch's mean; DDP synchronises at
    the last micro-batch only, FSDP2 reduce-scatters every micro-batch's gradient, its default,
    and holds no unsharded gradient between them), then ``opt.step()``, and returns the
    micro-batches' mean loss averaged over ``dp_group`` (``None``: this rank's). An optimizer
    that keeps fp32 masters (:func:`end2end.driver.megatron_optimizer.mixed_precision_optimizer`)
    scales each loss by its loss scale before the backward (``opt.scale_loss``; 1 in bf16) and
    skips a step whose gradients overflow. The builders of the torch modes use it, and the
    simulator's stand-in for DeepSpeed (:mod:`end2end.simulate.engine.modelled`)."""
    device = next(model.parameters()).device
    scale_loss = getattr(opt, "scale_loss", None)

    def step(batch: Batch) -> float:
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        parts = micro_batches(batch, microbatches)
        for i, part in enumerate(parts):
            with _gradient_sync(model, last=i == len(parts) - 1):
                loss = model(**{k: v.to(device) for k, v in part.items()}).loss
                scaled = loss / microbatches if microbatches > 1 else loss
                (scale_loss(scaled) if scale_loss is not None else scaled).backward()
            total += loss.detach().float() / microbatches
        opt.step()
        if dp_group is not None:
            dist.all_reduce(total, op=dist.ReduceOp.AVG, group=dp_group)
        return total.item()

    return step


def _gradient_sync(model: nn.Module, last: bool) -> Any:
    """DDP's ``no_sync()`` before the last micro-batch of an accumulated step (its gradients
    are all-reduced once, after the last backward); nothing otherwise."""
    if not last and isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def _deepspeed_pipeline_step(engine: Any) -> Callable[[Batch], float]:
    """One ``train_batch`` of a DeepSpeed pipeline engine; the loss is DeepSpeed's (averaged
    over micro-batches and data-parallel replicas, broadcast over the pipeline)."""
    from slapo.dialects.deepspeed_pipeline import pipeline_items

    def step(batch: Batch) -> float:
        return float(engine.train_batch(pipeline_items(engine, batch)))

    return step


@builds("megatron")
def _megatron_baseline(request: RunnerRequest) -> Runner:
    """megatron-core's own model from the HF config, under its runtime."""
    from slapo.dialects.megatron import MegatronRuntime

    from end2end.driver.baselines.megatron_core import build_megatron_model, megatron_loss_fn
    from end2end.driver.megatron_optimizer import megatron_optimizer_factory

    config = config_of(request.model_or_config)
    if isinstance(config, nn.Module):
        raise ConfigError("mode 'megatron' builds its own model from a config",
                          call="make_runner", hint="pass the model's config")
    ckpt = request.ckpt
    model = build_megatron_model(config, request.tensor_parallel,
                                 recompute=ckpt if isinstance(ckpt, str) else None,
                                 seed=request.seed, dtype=request.dtype)
    if request.dtype is not None:
        model = model.to(request.dtype)
    opt = megatron_optimizer_factory(request.optimizer, request.dtype)(
        [p for p in model.parameters() if p.requires_grad])
    runtime = MegatronRuntime(model, opt, megatron_loss_fn(config), request.num_microbatches)
    return Runner(request.mode.name, model, opt, runtime.train_step)


@builds("slapo-megatron")
def _megatron_runner(request: RunnerRequest) -> Runner:
    """The scheduled model under megatron-core's runtime."""
    from end2end.driver.megatron_optimizer import megatron_optimizer_factory

    runtime, opt = slapo.build(scheduled_model(request), target="megatron",
                               optimizer=megatron_optimizer_factory(request.optimizer,
                                                                    request.dtype),
                               num_microbatches=request.num_microbatches)
    return Runner(request.mode.name, runtime.module, opt, runtime.train_step)


@builds("fsdp", "slapo-fsdp")
def _fsdp_runner(request: RunnerRequest) -> Runner:
    """FSDP2 over the (scheduled) model; data parallel over the world."""
    built, opt = slapo.build(scheduled_model(request), target="fsdp",
                             optimizer=request.optimizer,
                             mixed_precision=request.dtype if request.low_precision else None)
    dp_group = dist.group.WORLD if request.env.world_size > 1 else None
    return Runner(request.mode.name, built, opt,
                  plain_torch_step(built, opt, dp_group, request.num_microbatches))


def _with_mode_recipe(request: RunnerRequest) -> RunnerRequest:
    """The request with its mode's recipe (:attr:`~end2end.spec.modes.Mode.recipe`, e.g.
    ``"auto"``) in place of the model's own, keeping the run's knobs."""
    recipe, schedule = request.mode.recipe, request.schedule
    if recipe is None or not isinstance(schedule, ModelSchedule):
        return request
    return dataclasses.replace(request, schedule=ModelSchedule(recipe, dict(schedule.knobs)))


@builds("eager", "slapo", "slapo-auto")
def _torch_runner(request: RunnerRequest) -> Runner:
    """Plain PyTorch; the unscheduled model is data parallel (DDP) on several ranks, the
    scheduled one runs its own (TP) layout (the mode's recipe where it has one); in low
    precision the cast model, with fp32 masters in the optimizer where the run asks for them."""
    built, _ = slapo.build(scheduled_model(_with_mode_recipe(request)), target="torch")
    built = built.to(request.env.device)
    params = [p for p in built.parameters() if p.requires_grad]
    if request.optimizer_keeps_masters:  # the run's fp32_masters: apex O2's way
        from end2end.driver.megatron_optimizer import mixed_precision_optimizer

        # the overflow vote over the world: TP shards differ, DDP replicas agree
        opt = mixed_precision_optimizer(params, request.dtype, request.optimizer,
                                        vote_group=None)
    else:
        opt = request.optimizer(params)
    dp_group = None
    if not request.mode.slapo and request.env.world_size > 1:  # data parallel
        built = torch.nn.parallel.DistributedDataParallel(built)
        dp_group = dist.group.WORLD
    return Runner(request.mode.name, built, opt,
                  plain_torch_step(built, opt, dp_group, request.num_microbatches))


@builds("deepspeed", "slapo-deepspeed")
def _deepspeed_runner(request: RunnerRequest) -> Runner:
    """DeepSpeed's engine (ZeRO-3 unless the config says otherwise) over the (scheduled)
    model."""
    ds_config = dict(request.deepspeed_config or default_deepspeed_config())
    _add_precision(ds_config, request.dtype)
    engine, opt = slapo.build(scheduled_model(request), target="deepspeed",
                              optimizer=request.optimizer, config=ds_config)
    return Runner(request.mode.name, engine, opt,
                  _deepspeed_step(engine, request.num_microbatches))


def _add_precision(ds_config: Dict[str, Any], dtype: Optional[torch.dtype]) -> None:
    """DeepSpeed's fp16/bf16 section for a low-precision run (fp32 master weights)."""
    if dtype is not None and dtype != torch.float32:
        ds_config["bf16" if dtype == torch.bfloat16 else "fp16"] = {"enabled": True}


@builds("dtensor-tp")
def _dtensor_tp_runner(request: RunnerRequest) -> Runner:
    """``dtensor-tp``: the family's DTensor plan over a 1-D mesh of all ranks; forward and
    backward under ``loss_parallel``; the loss a DTensor, read whole."""
    from torch.distributed.device_mesh import init_device_mesh

    from end2end.driver.baselines.dtensor_plans import apply_tp_plan, parallel_loss

    env, model = request.env, prepare_hf_model(request)
    family = getattr(getattr(model, "config", None), "model_type", None) or "wideresnet"
    mesh = init_device_mesh(env.device.type, (env.world_size,))
    model = apply_tp_plan(model.to(env.device), family, mesh)
    opt = request.optimizer([p for p in model.parameters() if p.requires_grad])

    microbatches = request.num_microbatches

    def step(batch: Batch) -> float:
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for part in micro_batches(batch, microbatches):
            with parallel_loss():
                loss = model(**{k: v.to(env.device) for k, v in part.items()}).loss
                (loss / microbatches if microbatches > 1 else loss).backward()
            loss = loss.detach()
            total += (loss.full_tensor() if hasattr(loss, "full_tensor") else loss).item()
        opt.step()
        return total / microbatches

    return Runner(request.mode.name, model, opt, step)


@builds("hf-tp")
def _hf_tp_runner(request: RunnerRequest) -> Runner:
    """``hf-tp``: transformers' own tensor parallelism from the model's plan over all ranks
    (:mod:`end2end.driver.baselines.hf_tp`); the loss HF computes (gathered logits), the same
    on every rank."""
    from end2end.driver.baselines.hf_tp import apply_hf_tensor_parallel

    env = request.env
    model = apply_hf_tensor_parallel(prepare_hf_model(request).to(env.device), env.world_size)
    opt = request.optimizer([p for p in model.parameters() if p.requires_grad])
    return Runner(request.mode.name, model, opt,
                  plain_torch_step(model, opt, microbatches=request.num_microbatches))


def pipeline_runner(request: RunnerRequest, sch: slapo.Schedule) -> Runner:
    """A pipelined run on the mode's pipeline target (``torch``: the torch pipeline dialect,
    ``deepspeed``: a DeepSpeed ``PipelineEngine``; see the module docstring)."""
    from slapo.pipeline.stages import CUTS_KEY

    stages, name = request.pipeline_parallel, request.mode.name
    cuts = list(sch.metadata.get(CUTS_KEY) or [])
    if len(cuts) + 1 != stages:
        raise ConfigError(f"pipeline_parallel={stages} but the schedule cuts "
                          f"{len(cuts) + 1} stage(s) (cuts after {cuts})", call="make_runner",
                          hint=f"cut_pipeline_stage() after {stages - 1} layer(s), e.g. the "
                          "recipe's knob pipeline_cuts="
                          "end2end.driver.pipeline_plan.stage_cuts(...)")
    if request.mode.pipeline_target == "torch":
        model, opt = slapo.build(sch, target="torch", optimizer=request.optimizer,
                                 n_microbatches=request.num_microbatches)
        return Runner(name, model, opt, model.train_step)
    config = dict(request.deepspeed_config or {})
    _add_precision(config, request.dtype)
    engine, opt = slapo.build(sch, target="deepspeed", optimizer=request.optimizer,
                              config=config)
    return Runner(name, engine, opt, _deepspeed_pipeline_step(engine))
