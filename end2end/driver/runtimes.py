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
train the model cast to ``dtype`` with the optimizer's states in ``dtype`` (pure low precision).

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
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Dict, Iterator, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

import slapo
from slapo.runtime.distributed import init_distributed, teardown
from slapo.errors import ConfigError

from end2end.spec.modes import MODES, Mode, get_mode

__all__ = ["MODES", "Runner", "RunnerRequest", "ModelSchedule", "BUILDERS", "builds",
           "make_runner", "hf_model_from_config", "default_optimizer", "default_deepspeed_config",
           "config_of", "prepare_hf_model", "scheduled_model", "schedule_group"]

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


def config_of(model_or_config: Any) -> Any:
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


@dataclasses.dataclass
class RunnerRequest:
    """What :func:`make_runner` was asked for, handed to the mode's builder: the mode's table
    entry, the model (or its config), and the run's parallel sizes, precision and options."""

    mode: Mode
    model_or_config: Any
    schedule: Optional[Union[ScheduleFn, ModelSchedule]]
    ckpt: Union[bool, str, None]
    optimizer: Callable[[Any], torch.optim.Optimizer]
    deepspeed_config: Optional[Dict[str, Any]]
    num_microbatches: int
    seed: int
    dtype: Optional[torch.dtype]
    tensor_parallel: int
    pipeline_parallel: int
    env: Any

    @property
    def low_precision(self) -> bool:
        return self.dtype is not None and self.dtype != torch.float32


Builder = Callable[[RunnerRequest], Runner]
BUILDERS: Dict[str, Builder] = {}


def builds(*modes: str) -> Callable[[Builder], Builder]:
    """Register a builder for the named modes (each must be in the table of modes, and each
    mode has exactly one builder: tests/end2end/driver/test_modes.py checks both)."""
    def register(fn: Builder) -> Builder:
        for name in modes:
            get_mode(name)  # a builder for a mode the table does not know is a bug
            assert name not in BUILDERS, f"two builders for mode {name!r}"
            BUILDERS[name] = fn
        return fn

    return register


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
        optimizer: factory ``fn(params)``, the same in every mode.
        deepspeed_config: DeepSpeed config of the ``*deepspeed`` modes (default ZeRO-3).
        num_microbatches: micro-batches per step of the ``*megatron`` modes and pipelines.
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

    Raises:
        ConfigError: an unknown mode; pipeline stages in a mode without pipelines, or a
            schedule that does not cut the model into ``pipeline_parallel`` stages.
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
    env = init_distributed()
    tp = tensor_parallel or (env.world_size // pipeline_parallel
                             if info.tp_default or pipeline_parallel > 1 else 1)
    request = RunnerRequest(info, model_or_config, schedule, ckpt, optimizer, deepspeed_config,
                            num_microbatches, seed, dtype, tp, pipeline_parallel, env)
    if pipeline_parallel > 1:
        return _builders.pipeline_runner(request, scheduled_model(request))
    return BUILDERS[mode](request)


def schedule_group(request: RunnerRequest) -> Any:
    """The tensor-parallel group a Slapo mode's schedule shards over (None = the world):
    :attr:`~end2end.spec.modes.Mode.schedule_group`. A pipeline (``pipeline_parallel`` > 1)
    always gets this rank's block of ``tensor_parallel`` consecutive ranks, whatever the mode's
    kind: ``slapo-deepspeed``'s one-rank groups are for ZeRO-3 without a pipeline (its
    "TP 8 x PP 2" lines shard each stage over 8 ranks)."""
    kind, tp, world = (request.mode.schedule_group, request.tensor_parallel,
                       request.env.world_size)
    if kind == "megatron":
        from slapo.dialects.megatron import initialize_megatron

        return initialize_megatron(tp)
    if (request.pipeline_parallel > 1 or kind in ("blocks", "single")) and world > 1:
        # pipelines (torch or DeepSpeed) and TP x FSDP: this rank's block of tp consecutive
        # ranks (slapo.dialects.layout, DeepSpeed's PipeModelDataParallelTopology); ZeRO-3
        # without a pipeline: one rank per group
        single = kind == "single" and request.pipeline_parallel == 1
        group, _ = dist.new_subgroups(group_size=1 if single else tp)
        return group
    return None


def prepare_hf_model(request: RunnerRequest) -> nn.Module:
    """The HF model of a mode that trains it: built from the config unless given, HF gradient
    checkpointing for a baseline with ``ckpt``, cast to a low ``dtype`` unless the runtime keeps
    fp32 master weights of the fp32 model (:attr:`~end2end.spec.modes.Mode.master_weights`)."""
    model = request.model_or_config
    if not isinstance(model, nn.Module):
        model = hf_model_from_config(config_of(model), request.seed)
    ckpt = request.ckpt
    if request.mode.ckpt == "hf" and ckpt and ckpt != "0":
        model.gradient_checkpointing_enable()
    mode = request.mode
    if request.low_precision and (not mode.mixed_precision or mode.master_weights != "runtime"):
        model = model.to(request.dtype)
    return model


def scheduled_model(request: RunnerRequest) -> slapo.Schedule:
    """The HF model under a schedule: the Slapo modes' recipe (on the mode's TP group, with
    per-TP-rank RNG streams), an empty schedule for the baselines (the same build path)."""
    info = request.mode
    group = schedule_group(request) if info.slapo else None
    model = prepare_hf_model(request)
    schedule = request.schedule if info.slapo else None
    if request.pipeline_parallel > 1:
        # the recipe runs the model to trace and cut it: its fork_rng (attention dropout on
        # this rank's heads) needs the TP stream now; the RNG state the schedule sees is kept
        with _rng_state_kept():
            _seed_tensor_parallel_streams(request, group)
    if isinstance(schedule, ModelSchedule):
        sch = schedule.apply(model, group)
    else:
        sch = slapo.create_schedule(model, group=group)
        if schedule is not None:
            schedule(sch)
    _seed_tensor_parallel_streams(request, group)
    return sch


def _seed_tensor_parallel_streams(request: RunnerRequest, group: Any) -> None:
    """Per-TP-rank RNG streams for a Slapo schedule's fork_rng (attention dropout on this
    rank's heads); the default stream is shared by the TP group (megatron-core has its own
    tracker)."""
    info, env = request.mode, request.env
    tp_size = dist.get_world_size(group) if env.world_size > 1 else 1  # group None: the world
    if info.slapo and info.schedule_group != "megatron" and tp_size > 1:
        slapo.set_random_seed(request.seed, dp_rank=env.rank // tp_size,
                              tp_rank=dist.get_rank(group))


@contextlib.contextmanager
def _rng_state_kept() -> Iterator[None]:
    """Python's, NumPy's and torch's (CPU and CUDA) default RNG states are restored on exit."""
    import random

    import numpy as np

    states = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        yield
    random.setstate(states[0])
    np.random.set_state(states[1])


# The builders register themselves (an explicit import, as every registry here).
from end2end.driver import builders as _builders  # noqa: E402  (after BUILDERS exists)
