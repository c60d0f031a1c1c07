"""One runner per benchmark mode, all with the same API: ``runner.train_step(batch) -> loss``.

``make_runner(mode, model_or_config, ...)`` builds the model of a mode on this rank and returns a
:class:`Runner`; the benchmark driver feeds every mode the same HuggingFace-style batches
(``input_ids``, ``attention_mask``, ``labels``) and times ``train_step``. Modes:

===================  ==========================================================================
``deepspeed``        the unscheduled HF model under DeepSpeed ZeRO-3 (HF gradient checkpointing
                     with ``ckpt``), built through ``slapo.build(target="deepspeed")`` with an
                     empty schedule, so it gets exactly the same engine as ``slapo-deepspeed``
``slapo-deepspeed``  the scheduled HF model (``schedule(sch)``) under the same engine
``slapo-megatron``   the scheduled tensor-parallel HF model (TP = world size) under megatron-core's
                     runtime (``slapo.build(target="megatron")``)
``megatron``         megatron-core's own GPT/BERT/T5 built from the HF config
                     (:mod:`end2end.driver.baselines.megatron_core`) under the same runtime
``eager``            the unscheduled HF model on plain PyTorch (HF gradient checkpointing with
                     ``ckpt``; data parallel with ``DistributedDataParallel`` on several ranks)
``slapo``            the scheduled model on plain PyTorch (``slapo.build(target="torch")``);
                     on several ranks the schedule shards it (TP = world size)
``fsdp``             the unscheduled HF model under FSDP2 (``fully_shard`` per layer + root),
                     built through ``slapo.build(target="fsdp")`` with an empty schedule, so it
                     gets exactly the same wrapping as ``slapo-fsdp``
``slapo-fsdp``       the scheduled model under the same FSDP2 wrapping; with
                     ``tensor_parallel`` > 1 the schedule shards over blocks of that many
                     consecutive ranks and FSDP over the rest (TP x FSDP)
``dtensor-tp``       the unscheduled HF model with PyTorch's DTensor TP plan of its family
                     (:mod:`end2end.driver.baselines.dtensor_plans`, TP = world size), the loss
                     under
                     ``loss_parallel``
===================  ==========================================================================

Low precision (``dtype`` bf16/fp16): the DeepSpeed and FSDP2 modes train in mixed precision with
fp32 master weights; the others train the model cast to ``dtype``.

**Pipelines** (``pipeline_parallel`` > 1, modes ``slapo`` and ``slapo-deepspeed`` only): the
schedule must cut the model into that many stages (the driver passes the recipe's
``pipeline_cuts``/``example_inputs`` knobs, see :mod:`end2end.driver.pipeline_plan`); its group is
this
rank's block of ``tensor_parallel`` consecutive ranks (one-rank groups for TP 1), and the build
lays the world out as TP x DP x PP. ``slapo`` trains with the torch pipeline dialect
(``PipelineModel.train_step``, ``num_microbatches`` micro-batches, GPipe), ``slapo-deepspeed``
with DeepSpeed's ``PipelineEngine.train_batch`` (the DeepSpeed config gives the micro-batches;
ZeRO stage 0/1).

Every mode uses the same optimizer (default AdamW, lr 1.5e-4, as the artifact's Megatron runs).
Schedules (kernels, sharding, checkpointing) come from ``schedule``: a callable ``fn(sch)``, or a
:class:`ModelSchedule` naming a recipe of :mod:`slapo.model_schedule` and its knobs (the
benchmark driver's choice; the recipe gets the mode's tensor-parallel group: megatron's for
``slapo-megatron``, the world for ``slapo``, a one-rank group for ``slapo-deepspeed``, which is
ZeRO-3 without TP). Activation checkpointing of the Slapo modes is the schedule's business,
``ckpt`` only affects the baselines.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

import slapo
from slapo.runtime.distributed import init_distributed, teardown
from slapo.errors import ConfigError

from end2end.spec.runspec import MODES

__all__ = ["MODES", "Runner", "ModelSchedule", "make_runner", "hf_model_from_config",
           "default_optimizer"]

Batch = Dict[str, torch.Tensor]
ScheduleFn = Callable[[slapo.Schedule], None]

_AUTO_CLASS = {"t5": "AutoModelForSeq2SeqLM", "bert": "AutoModelForMaskedLM",
               "roberta": "AutoModelForMaskedLM", "albert": "AutoModelForMaskedLM"}


def default_optimizer(params: Any) -> torch.optim.Optimizer:
    """The optimizer of every mode (so that modes differ only in their runtime)."""
    return torch.optim.AdamW(params, lr=1.5e-4)


def default_deepspeed_config() -> Dict[str, Any]:
    """ZeRO-3, fp32, no DeepSpeed optimizer section (a torch optimizer is passed), and no
    gradient clipping (DeepSpeed's default clips at 1.0; the megatron runtime does not clip)."""
    return {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 3}}


def _config_of(model_or_config: Any) -> Any:
    """A model name of the benchmark's zoo (``end2end.models``) becomes its HF config."""
    if isinstance(model_or_config, str):
        from end2end.models import build_hf_config

        return build_hf_config(model_or_config)
    return model_or_config


def hf_model_from_config(config: Any, seed: int = 0) -> nn.Module:
    """The HF training model of ``config`` (causal LM, masked LM or seq2seq), seeded, train mode."""
    import transformers

    cls = getattr(transformers, _AUTO_CLASS.get(config.model_type, "AutoModelForCausalLM"))
    torch.manual_seed(seed)
    return cls.from_config(config).train()


@dataclasses.dataclass(frozen=True)
class ModelSchedule:
    """A recipe of :mod:`slapo.model_schedule` (``family``, e.g. ``"gpt_neo"``) and its knobs
    (``ScheduleConfig`` fields such as ``attn_kernel``, ``ckpt_ratio``, ``dtype``; never
    ``group``: the runner passes the mode's tensor-parallel group)."""

    family: str
    knobs: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def apply(self, model: nn.Module, group: Any) -> slapo.Schedule:
        from slapo.model_schedule import apply_schedule

        return apply_schedule(model, self.family, group=group, **self.knobs)


@dataclasses.dataclass
class Runner:
    """A built model of one mode. ``train_step(batch)`` runs one optimizer step on this rank's
    batch and returns the loss averaged over data-parallel ranks; ``close()`` tears the runtime
    down (process groups created for it, megatron state)."""

    mode: str
    model: Any
    optimizer: Any
    step_fn: Callable[[Batch], float]

    def train_step(self, batch: Batch) -> float:
        return self.step_fn(batch)

    def close(self) -> None:
        teardown()


def _deepspeed_step(engine: Any) -> Callable[[Batch], float]:
    group = getattr(engine, "data_parallel_group", None)

    def step(batch: Batch) -> float:
        loss = engine(**{k: v.to(engine.device) for k, v in batch.items()}).loss
        engine.backward(loss)
        engine.step()
        loss = loss.detach().clone()
        dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=group)
        return loss.item()

    return step


def _torch_step(model: nn.Module, opt: torch.optim.Optimizer,
                dp_group: Any = None) -> Callable[[Batch], float]:
    """Plain PyTorch: forward, backward, optimizer step; the loss averaged over ``dp_group``."""
    device = next(model.parameters()).device

    def step(batch: Batch) -> float:
        opt.zero_grad(set_to_none=True)
        loss = model(**{k: v.to(device) for k, v in batch.items()}).loss
        loss.backward()
        opt.step()
        loss = loss.detach().clone()
        if dp_group is not None:
            dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=dp_group)
        return loss.item()

    return step


def _deepspeed_pipeline_step(engine: Any) -> Callable[[Batch], float]:
    """One ``train_batch`` of a DeepSpeed pipeline engine; the loss is DeepSpeed's (averaged
    over micro-batches and data-parallel replicas, broadcast over the pipeline)."""
    from slapo.dialects.deepspeed_pipeline import pipeline_items

    def step(batch: Batch) -> float:
        return float(engine.train_batch(pipeline_items(engine, batch)))

    return step


def _schedule_group(mode: str, world_size: int, tp: int, pp: int = 1) -> Any:
    """The tensor-parallel group a Slapo mode's schedule shards over (None = the world)."""
    if mode == "slapo-megatron":
        from slapo.dialects.megatron import initialize_megatron

        return initialize_megatron(tp)
    if (pp > 1 or mode in ("slapo-deepspeed", "slapo-fsdp")) and world_size > 1:
        # pipelines and TP x FSDP: this rank's block of tp consecutive ranks
        # (slapo.dialects.layout); ZeRO-3 without TP: one rank per group
        group, _ = dist.new_subgroups(group_size=1 if mode == "slapo-deepspeed" else tp)
        return group
    return None


def make_runner(
    mode: str,
    model_or_config: Union[str, Any, nn.Module],
    *,
    schedule: Optional[ScheduleFn] = None,
    ckpt: Union[bool, str, None] = None,
    optimizer: Callable[[Any], torch.optim.Optimizer] = default_optimizer,
    deepspeed_config: Optional[Dict[str, Any]] = None,
    num_microbatches: int = 1,
    seed: int = 0,
    dtype: Optional[torch.dtype] = None,
    tensor_parallel: Optional[int] = None,
    pipeline_parallel: int = 1,
) -> Runner:
    """Build ``mode``'s model on this rank (see the module docstring).

    Args:
        model_or_config: a transformers config or a model name of the zoo
            (``end2end.models``, e.g. ``"gpt2-medium"``); the ``deepspeed``/``slapo-*`` modes
            also take a built HF model.
        schedule: the Slapo schedule of the Slapo modes: ``fn(sch)`` or a
            :class:`ModelSchedule` (ignored by the baselines).
        ckpt: activation checkpointing of the baselines: truthy for HF gradient checkpointing
            (``deepspeed``, ``eager``), ``"full"``/``"selective"`` for megatron's recomputation.
        optimizer: factory ``fn(params)``, the same in every mode.
        deepspeed_config: DeepSpeed config of the ``*deepspeed`` modes (default ZeRO-3).
        num_microbatches: micro-batches per step of the ``*megatron`` modes.
        seed: weights are drawn after ``torch.manual_seed(seed)``.
        dtype: training precision (default fp32). DeepSpeed modes get the matching
            ``fp16``/``bf16`` config section (mixed precision, fp32 master weights in ZeRO);
            the other modes train the model cast to ``dtype`` (pure low precision).
        tensor_parallel: TP size of the ``*megatron`` modes (default: the world size; the rest
            of the ranks are data parallel), of pipelines, and of ``slapo-fsdp`` (default 1:
            FSDP2 alone; T > 1: TP over blocks of T consecutive ranks x FSDP over the rest).
        pipeline_parallel: number of pipeline stages (``slapo``/``slapo-deepspeed``; the
            schedule must cut that many stages, see the module docstring).

    Raises:
        ConfigError: an unknown mode; pipeline stages in another mode, or a schedule that does
            not cut the model into ``pipeline_parallel`` stages.
    """
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}", call="make_runner",
                          hint=f"use one of {', '.join(MODES)}")
    if pipeline_parallel > 1 and mode not in ("slapo", "slapo-deepspeed"):
        raise ConfigError(f"mode {mode!r} cannot run {pipeline_parallel} pipeline stages",
                          call="make_runner", hint="pipelines run in modes 'slapo' and "
                          "'slapo-deepspeed'; see end2end.driver.pipeline_plan")
    env = init_distributed()
    # default TP: the world (over the pipeline stages); slapo-fsdp is data parallel (FSDP2)
    tp = tensor_parallel or (1 if mode == "slapo-fsdp" else env.world_size // pipeline_parallel)
    if mode == "megatron":
        from slapo.dialects.megatron import MegatronRuntime

        from end2end.driver.baselines.megatron_core import build_megatron_model, megatron_loss_fn

        config = _config_of(model_or_config)
        if isinstance(config, nn.Module):
            raise ConfigError("mode 'megatron' builds its own model from a config",
                              call="make_runner", hint="pass the model's config")
        model = build_megatron_model(config, tp,
                                     recompute=ckpt if isinstance(ckpt, str) else None,
                                     seed=seed)
        if dtype is not None:
            model = model.to(dtype)
        opt = optimizer([p for p in model.parameters() if p.requires_grad])
        runtime = MegatronRuntime(model, opt, megatron_loss_fn(config), num_microbatches)
        return Runner(mode, model, opt, runtime.train_step)

    group = (_schedule_group(mode, env.world_size, tp, pipeline_parallel)
             if mode.startswith("slapo") else None)
    model = model_or_config
    if not isinstance(model, nn.Module):
        model = hf_model_from_config(_config_of(model_or_config), seed)
    if mode in ("deepspeed", "eager", "fsdp", "dtensor-tp") and ckpt and ckpt != "0":
        model.gradient_checkpointing_enable()
    low = dtype is not None and dtype != torch.float32
    mixed = mode.endswith("deepspeed") or mode.endswith("fsdp")  # fp32 master weights
    if low and not mixed:
        model = model.to(dtype)
    if mode == "dtensor-tp":
        return _dtensor_tp_runner(model, optimizer, env)
    if isinstance(schedule, ModelSchedule) and mode.startswith("slapo"):
        sch = schedule.apply(model, group)
    else:
        sch = slapo.create_schedule(model, group=group)
        if schedule is not None and mode.startswith("slapo"):
            schedule(sch)
    tp_size = dist.get_world_size(group) if env.world_size > 1 else 1  # group None: the world
    if mode in ("slapo", "slapo-deepspeed", "slapo-fsdp") and tp_size > 1:
        # per-TP-rank RNG streams for the schedule's fork_rng (attention dropout on this
        # rank's heads); the default stream is shared by the TP group
        slapo.set_random_seed(seed, dp_rank=env.rank // tp_size, tp_rank=dist.get_rank(group))
    if pipeline_parallel > 1:
        return _pipeline_runner(mode, sch, pipeline_parallel, optimizer, num_microbatches,
                                deepspeed_config, dtype)
    if mode == "slapo-megatron":
        runtime, opt = slapo.build(sch, target="megatron", optimizer=optimizer,
                                   num_microbatches=num_microbatches)
        return Runner(mode, runtime.module, opt, runtime.train_step)
    if mode.endswith("fsdp"):
        built, opt = slapo.build(sch, target="fsdp", optimizer=optimizer,
                                 mixed_precision=dtype if low else None)
        return Runner(mode, built, opt, _torch_step(built, opt, dist.group.WORLD
                                                    if env.world_size > 1 else None))
    if mode in ("eager", "slapo"):
        built, _ = slapo.build(sch, target="torch")
        built = built.to(env.device)
        opt = optimizer([p for p in built.parameters() if p.requires_grad])
        dp_group = None
        if mode == "eager" and env.world_size > 1:  # data parallel
            built = torch.nn.parallel.DistributedDataParallel(built)
            dp_group = dist.group.WORLD
        return Runner(mode, built, opt, _torch_step(built, opt, dp_group))
    ds_config = dict(deepspeed_config or default_deepspeed_config())
    if low:
        ds_config["bf16" if dtype == torch.bfloat16 else "fp16"] = {"enabled": True}
    engine, opt = slapo.build(sch, target="deepspeed", optimizer=optimizer, config=ds_config)
    return Runner(mode, engine, opt, _deepspeed_step(engine))


def _dtensor_tp_runner(model: nn.Module, optimizer: Callable, env: Any) -> Runner:
    """``dtensor-tp``: the family's DTensor plan over a 1-D mesh of all ranks; forward and
    backward under ``loss_parallel``; the loss a DTensor, read whole."""
    from torch.distributed.device_mesh import init_device_mesh

    from end2end.driver.baselines.dtensor_plans import apply_tp_plan, parallel_loss

    family = getattr(getattr(model, "config", None), "model_type", None) or "wideresnet"
    mesh = init_device_mesh(env.device.type, (env.world_size,))
    model = apply_tp_plan(model.to(env.device), family, mesh)
    opt = optimizer([p for p in model.parameters() if p.requires_grad])

    def step(batch: Batch) -> float:
        opt.zero_grad(set_to_none=True)
        with parallel_loss():
            loss = model(**{k: v.to(env.device) for k, v in batch.items()}).loss
            loss.backward()
        opt.step()
        loss = loss.detach()
        return (loss.full_tensor() if hasattr(loss, "full_tensor") else loss).item()

    return Runner("dtensor-tp", model, opt, step)


def _pipeline_runner(mode: str, sch: slapo.Schedule, stages: int, optimizer: Callable,
                     num_microbatches: int, deepspeed_config: Optional[Dict[str, Any]],
                     dtype: Optional[torch.dtype]) -> Runner:
    """The pipelined ``slapo`` / ``slapo-deepspeed`` runner (see the module docstring)."""
    from slapo.pipeline.stages import CUTS_KEY

    cuts = list(sch.metadata.get(CUTS_KEY) or [])
    if len(cuts) + 1 != stages:
        raise ConfigError(f"pipeline_parallel={stages} but the schedule cuts "
                          f"{len(cuts) + 1} stage(s) (cuts after {cuts})", call="make_runner",
                          hint=f"cut_pipeline_stage() after {stages - 1} layer(s), e.g. the "
                          "recipe's knob pipeline_cuts="
                          "end2end.driver.pipeline_plan.stage_cuts(...)")
    if mode == "slapo":
        model, opt = slapo.build(sch, target="torch", optimizer=optimizer,
                                 n_microbatches=num_microbatches)
        return Runner(mode, model, opt, model.train_step)
    config = dict(deepspeed_config or {})
    if dtype is not None and dtype != torch.float32:
        config["bf16" if dtype == torch.bfloat16 else "fp16"] = {"enabled": True}
    engine, opt = slapo.build(sch, target="deepspeed", optimizer=optimizer, config=config)
    return Runner(mode, engine, opt, _deepspeed_pipeline_step(engine))
