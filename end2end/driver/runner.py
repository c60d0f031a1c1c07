"""What the builders of the benchmark modes share: the :class:`Runner` every mode returns, the
:class:`RunnerRequest` a builder gets, the registry of builders (:func:`builds`,
:class:`Builders`), and the model pieces the builders compose (:func:`scheduled_model`,
:func:`prepare_hf_model`, :func:`schedule_group`, the default optimizer and ZeRO-3 config).

:mod:`end2end.driver.runtimes` (``make_runner``) is the entry point; the builders themselves
are in :mod:`end2end.driver.builders`. This module imports neither of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from types import MappingProxyType
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

import slapo
from slapo.runtime.distributed import teardown
from slapo.errors import ConfigError

from end2end.spec.modes import Mode, get_mode

__all__ = ["Batch", "Runner", "RunnerRequest", "ModelSchedule", "Builder", "PipelineBuilder",
           "Builders", "BUILDERS", "builds", "hf_model_from_config", "default_optimizer",
           "default_deepspeed_config", "config_of", "prepare_hf_model", "without_kv_cache",
           "scheduled_model", "schedule_group"]

Batch = Dict[str, torch.Tensor]
ScheduleFn = Callable[[slapo.Schedule], None]

_AUTO_CLASS = {"t5": "AutoModelForSeq2SeqLM", "bert": "AutoModelForMaskedLM",
               "roberta": "AutoModelForMaskedLM", "albert": "AutoModelForMaskedLM"}


def default_optimizer(params: Any) -> torch.optim.Optimizer:
    """The optimizer of every mode (so that modes differ only in their runtime)."""
    return torch.optim.AdamW(params, lr=1.5e-4)


@dataclasses.dataclass(frozen=True)
class FP32Masters:
    """An optimizer factory that asks for fp32 master weights: :func:`with_fp32_masters`."""

    base: Callable[[Any], torch.optim.Optimizer]

    def __call__(self, params: Any) -> torch.optim.Optimizer:
        return self.base(params)


def with_fp32_masters(base: Callable[[Any], torch.optim.Optimizer]) -> FP32Masters:
    """``base`` (an optimizer factory ``fn(params)``) for a run that keeps fp32 master weights in
    fp16/bf16: a mode whose :attr:`~end2end.spec.modes.Mode.master_weights` is ``on_request``
    (``eager``, ``slapo``, ``slapo-auto``) then trains its cast model under megatron-core's
    mixed-precision optimizer over ``base`` (fp16 with dynamic loss scaling), as apex's O2 does;
    the ``mixed_precision`` modes keep masters anyway and use ``base`` as they would; the
    others refuse it (:meth:`~end2end.spec.modes.Mode.check_fp32_masters`). The driver's
    ``--fp32-masters``."""
    return FP32Masters(base)


def default_deepspeed_config(micro_batch: int = 1, accumulation: int = 1) -> Dict[str, Any]:
    """ZeRO-3 with ``micro_batch`` samples per rank and micro-batch, ``accumulation``
    micro-batches per step (gradient accumulation), fp32, no DeepSpeed optimizer section (a
    torch optimizer is passed), and no gradient clipping (DeepSpeed's default clips at 1.0; the
    megatron runtime does not clip). The one ZeRO-3 config of the harness: the driver's runs
    and the simulator's calibration use it."""
    return {"train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": accumulation,
            "gradient_clipping": 0.0, "zero_optimization": {"stage": 3}}


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

    @property
    def fp32_masters(self) -> bool:
        """The run asked for fp32 masters (:func:`with_fp32_masters`)."""
        return isinstance(self.optimizer, FP32Masters)

    @property
    def optimizer_keeps_masters(self) -> bool:
        """The cast model trains under an optimizer that keeps fp32 masters: the megatron modes
        in low precision, a plain-PyTorch mode whose run asked for ``fp32_masters``
        (:attr:`~end2end.spec.modes.Mode.master_weights`)."""
        kind = self.mode.master_weights
        return self.low_precision and (kind == "optimizer" or (kind == "on_request"
                                                               and self.fp32_masters))


Builder = Callable[[RunnerRequest], Runner]
PipelineBuilder = Callable[[RunnerRequest, slapo.Schedule], Runner]
BUILDERS: Dict[str, Builder] = {}


@dataclasses.dataclass(frozen=True)
class Builders:
    """The builders :func:`~end2end.driver.runtimes.make_runner` uses: one per mode
    (``modes``, by mode name) and the one of pipelined runs (``pipeline``, given the request
    and its schedule cut into stages). :func:`~end2end.driver.runtimes.default_builders` is the
    driver's table; a caller that builds some modes differently (the simulator's modelled
    runtimes, :mod:`end2end.simulate.engine.modelled`) passes a table made with :meth:`replace`."""

    modes: Mapping[str, Builder]
    pipeline: PipelineBuilder

    def replace(self, modes: Optional[Mapping[str, Builder]] = None,
                pipeline: Optional[PipelineBuilder] = None) -> "Builders":
        """A copy with the builders of the modes in ``modes`` (by mode name) and, if given,
        ``pipeline`` replaced; a name that is not a mode of the table is a ``ValueError``."""
        table = dict(self.modes)
        for name, fn in (modes or {}).items():
            if name not in table:
                raise ValueError(f"Builders.replace: no mode {name!r} in the table (modes: "
                                 f"{', '.join(sorted(table))})")
            table[name] = fn
        return Builders(MappingProxyType(table), pipeline or self.pipeline)


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


def without_kv_cache(model: nn.Module) -> None:
    """Training keeps no KV cache: ``use_cache=False`` on every config the model's modules hold.
    With it on (HF's default), each attention of a plain call appends its keys and values to a
    cache that lives until the forward returns: two extra hidden-sized activations per layer
    that no training framework keeps (the Slapo recipes turn it off the same way,
    :func:`slapo.model_schedule.common.disable_kv_cache`); every mode trains without it."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "use_cache", False):
            config.use_cache = False


def with_lean_loss(model: nn.Module) -> nn.Module:
    """``model``'s loss computed by slapo's memory-lean cross-entropy (the baseline knob
    ``lean_loss=True``, applied by :func:`end2end.driver.assemble.build_runner` to the model it
    builds): a HF causal LM's ``loss_function`` replaced, the same loss and gradients without
    a full-vocabulary fp32 tensor (:mod:`slapo.op.cross_entropy`).

    Raises:
        ConfigError: the model is not a HF causal LM (its loss shifts the labels)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from slapo.op.cross_entropy import WHOLE_VOCAB, VocabParallelCausalLMLoss

    if type(model).__name__ not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        raise ConfigError(f"lean_loss=True replaces a causal LM's loss; {type(model).__name__} "
                          "is not one", call="lean_loss",
                          hint="drop the knob for this model")
    model.loss_function = VocabParallelCausalLMLoss(WHOLE_VOCAB, lean=True)
    return model


def prepare_hf_model(request: RunnerRequest) -> nn.Module:
    """The HF model of a mode that trains it: built from the config unless given, without a KV
    cache (:func:`without_kv_cache`), HF gradient
    checkpointing for a baseline with ``ckpt``, cast to a low ``dtype`` unless the runtime keeps
    fp32 master weights of the fp32 model (:attr:`~end2end.spec.modes.Mode.master_weights`) and
    no pipeline stage is traced from it."""
    model = request.model_or_config
    if not isinstance(model, nn.Module):
        model = hf_model_from_config(config_of(model), request.seed)
    without_kv_cache(model)
    ckpt = request.ckpt
    if request.mode.ckpt == "hf" and ckpt and ckpt != "0":
        model.gradient_checkpointing_enable()
    mode = request.mode
    # A pipeline's stages are traced when the schedule cuts them, and a traced graph refuses a
    # dtype other than its trace's (slapo.trace guards): cast before the schedule, as DeepSpeed's
    # fp16/bf16 engine would cast the module after it (its fp32 masters are made from the cast
    # parameters either way). Without a pipeline, such a runtime keeps the fp32 model and the
    # schedule traces inside slapo.compute_dtype (scheduled_model); that would serve here too
    # (tests/end2end/driver/test_low_precision_traces.py passes either way).
    traced_stages = request.pipeline_parallel > 1
    if request.low_precision and (not mode.mixed_precision or mode.master_weights != "runtime"
                                  or traced_stages):
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
    # traces see the model as the runtime computes it: a mixed-precision runtime given the
    # fp32 model (FSDP2's policy, DeepSpeed's engine) computes in the low dtype
    with slapo.compute_dtype(request.dtype if request.low_precision else None):
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
