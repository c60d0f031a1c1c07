"""Registry of per-model schedules and ``apply_schedule``.

A model schedule is a short recipe ``recipe(sch, model_config, cfg, **extra) -> None`` that
applies primitives to a freshly created schedule. Recipes are registered explicitly with
``@register_model_schedule("bert", extra_knobs=(...))`` and imported in
``slapo/model_schedule/__init__.py``; ``sequence_parallel=True`` declares that the recipe takes
the ``sequence_parallel`` knob with tensor parallelism on every model of its family (what a
planner may search without building the model: :func:`supports_sequence_parallel`), ``None``
that the recipe decides per model (``auto``); the others refuse the knob in
:func:`check_knobs`, before any model is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from torch import nn

from ..errors import ConfigError, RegistryError
from ..schedule import Schedule, create_schedule
from .config import ScheduleConfig, make_config

__all__ = ["register_model_schedule", "apply_schedule", "list_model_schedules", "list_knobs",
           "check_knobs", "supports_sequence_parallel"]


@dataclasses.dataclass(frozen=True)
class _Entry:
    recipe: Callable[..., None]
    extra_knobs: Tuple[str, ...]
    sequence_parallel: Optional[bool] = False


_SCHEDULES: Dict[str, _Entry] = {}


def register_model_schedule(name: str, extra_knobs: Sequence[str] = (),
                            sequence_parallel: Optional[bool] = False):
    """Decorator registering ``recipe`` under ``name`` (with its family-specific knobs, and
    whether every model of the family takes ``sequence_parallel=True``: ``None`` when the
    recipe decides per model)."""

    def deco(recipe: Callable[..., None]) -> Callable[..., None]:
        if name in _SCHEDULES and _SCHEDULES[name].recipe is not recipe:
            raise RegistryError(f"a model schedule named '{name}' is already registered",
                                hint="choose another name")
        _SCHEDULES[name] = _Entry(recipe, tuple(extra_knobs), sequence_parallel)
        return recipe

    return deco


def list_model_schedules() -> list:
    """Names of the registered model schedules."""
    return sorted(_SCHEDULES)


def _entry(name: str) -> _Entry:
    if name not in _SCHEDULES:
        raise ConfigError(f"no model schedule named {name!r}", call="apply_schedule",
                          hint=f"registered: {', '.join(list_model_schedules()) or 'none'}")
    return _SCHEDULES[name]


def supports_sequence_parallel(name: str) -> bool:
    """Whether the recipe ``name`` declares sequence parallelism for every model it schedules
    (``auto`` decides per model, so it does not)."""
    return _entry(name).sequence_parallel is True


def list_knobs(name: str) -> List[str]:
    """Every knob the recipe ``name`` takes: the ``ScheduleConfig`` fields and its own."""
    fields = [f.name for f in dataclasses.fields(ScheduleConfig)]
    return sorted(set(fields) | set(_entry(name).extra_knobs))


def check_knobs(name: str, **knobs: Any) -> ScheduleConfig:
    """Validate knob names and the common knobs' values without a model (what
    ``apply_schedule`` checks first), e.g. before an expensive model build; returns the config.

    Raises:
        ConfigError: unknown recipe or knob (with the closest name and the valid ones), or an
            invalid value.
    """
    entry = _entry(name)
    _check_original_knobs(knobs, entry.extra_knobs)
    cfg, _ = make_config(knobs, entry.extra_knobs)
    _check_sequence_parallel(name, entry, cfg)
    return cfg


def _check_sequence_parallel(name: str, entry: _Entry, cfg: ScheduleConfig) -> None:
    if cfg.sequence_parallel and entry.sequence_parallel is False:
        with_sp = [n for n in list_model_schedules() if supports_sequence_parallel(n)]
        raise ConfigError(f"sequence_parallel is not supported by the {name} schedule",
                          call=f"apply_schedule({name!r})", hint="sequence parallelism is "
                          f"implemented for {', '.join(with_sp)} (and, per model, auto); drop "
                          "the knob")


def apply_schedule(model: nn.Module, name: str, model_config: Any = None,
                   **knobs: Any) -> Schedule:
    """Schedule ``model`` with the recipe ``name`` and return the schedule (build it next).

    Args:
        model: the unmodified model (e.g. ``transformers.BertForMaskedLM(config)``).
        name: the recipe (``list_model_schedules()``).
        model_config: the model's config (default: ``model.config``).
        **knobs: ``ScheduleConfig`` fields plus the recipe's own knobs; anything else is an error.

    After the recipe, ``fast_dropout`` (default on) swaps the model's ``nn.Dropout`` modules for
    :class:`slapo.op.dropout.Dropout`.

    Raises:
        ConfigError: unknown recipe or knob, or an invalid knob value.
    """
    entry = _entry(name)
    _check_original_knobs(knobs, entry.extra_knobs)
    cfg, extra = make_config(knobs, entry.extra_knobs)
    _check_sequence_parallel(name, entry, cfg)
    model_config = model_config if model_config is not None else getattr(model, "config", None)
    if cfg.dtype != "fp32":
        model = model.to(cfg.torch_dtype)
    sch = create_schedule(model, group=cfg.group)
    entry.recipe(sch, model_config, cfg, **extra)
    if cfg.fast_dropout:
        from .common import fast_dropout

        fast_dropout(sch)
    return sch




# Knobs of the original Slapo's model schedules that are spelled differently here
# (docs/porting.md); a recipe that has a knob of that name keeps it.
ORIGINAL_KNOBS = {
    "fp16": "dtype='fp16'",
    "bf16": "dtype='bf16'",
    "attn_op_name": "attn_kernel= ('auto', 'flash', 'efficient', 'math', 'cudnn' or 'eager'; "
                    "the original's 'cuda'/'triton' are 'flash', 'cutlass' is 'efficient', "
                    "'native_xformers' is 'math')",
    "disable_fuse_bias_gelu": "fuse_bias_gelu= (the opposite truth value; BERT family), or "
                              "fuse=False for every fusion",
    "fuse_conv": "fuse_conv_bn= (WideResNet: folds each BatchNorm into its conv)",
    "bcast_input": "torch.distributed.broadcast of the batch from the first tensor-parallel "
                   "rank, in the training loop (the end2end driver feeds every rank the same "
                   "batch); the knob is gone",
    "checkpoint_method": "ckpt_ratio= alone: round(L * ratio) layers, evenly spaced (the "
                         "original's 'uniform'/'head' choices are gone)",
}


def _check_original_knobs(knobs: Dict[str, Any], extra: Sequence[str]) -> None:
    for key in knobs:
        if key in ORIGINAL_KNOBS and key not in extra:
            raise ConfigError(f"knob {key!r} is the original Slapo's, spelled differently here",
                              call="apply_schedule", hint=ORIGINAL_KNOBS[key])
