"""Model-schedule knobs of a benchmark run: ``--knob NAME=VALUE`` on the driver, ``#@ knobs=``
in a config, the ``Knobs`` column of a results row.

A run's knobs travel as one canonical text, ``name=value,name=value`` sorted by name (``""`` =
the recipe's defaults), which is part of the run's key: two knob sets of one config line are two
runs. Values are Python literals (``False``, ``0.5``, ``'eager'``) or bare words (``eager``).
The knobs reach ``slapo.model_schedule.apply_schedule`` in the Slapo modes; names and the
common knobs' values are checked before anything is built (``check_knobs``), the rest by the
recipe itself: either way a wrong knob is a ``fail`` row that names the valid ones. The
baselines that train the HF model as it is take :data:`BASELINE_KNOBS` only (the driver applies
them to the model it builds: ``end2end.driver.assemble.build_runner``).
"""

from __future__ import annotations

import ast
from typing import Any, Dict, Iterable

from slapo.errors import ConfigError

__all__ = ["DRIVER_KNOBS", "BASELINE_KNOBS", "LEAN_LOSS_MODES", "parse_knobs", "format_knobs",
           "check_run_knobs"]

# Knobs the driver sets from the run itself: giving them as --knob would contradict the line.
DRIVER_KNOBS = {"group": "the driver's TP group", "ckpt_ratio": "the CKPT field / --ckpt",
                "ckpt_policy": "the CKPT field / --ckpt (op)",
                "dtype": "--dtype", "pipeline_cuts": "--pp", "example_inputs": "--pp"}

#: Knobs of the baselines that train the HF model unscheduled (:data:`LEAN_LOSS_MODES`):
#: ``lean_loss=True`` computes a causal LM's loss with slapo's memory-lean cross-entropy
#: (``slapo.op.cross_entropy``, ``lean=True``: no full-vocabulary fp32 tensor, as the fused
#: cross-entropy kernels that e.g. llm-foundry trains MPT with) instead of HF's
BASELINE_KNOBS = {"lean_loss": (True, False)}
LEAN_LOSS_MODES = ("eager", "fsdp", "deepspeed")


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word: attn_kernel=eager


def _text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def parse_knobs(text: str, where: str = "--knob") -> Dict[str, Any]:
    """``"a=1,b=eager"`` -> ``{"a": 1, "b": "eager"}``; ``""`` -> ``{}``."""
    knobs: Dict[str, Any] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name.isidentifier() or not value:
            raise ConfigError(f"{where}: knob {item!r} is not NAME=VALUE",
                              hint="e.g. shard_embedding=False or attn_kernel=eager")
        if name in knobs:
            raise ConfigError(f"{where}: knob {name!r} is given twice")
        knobs[name] = _value(value)
    return knobs


def format_knobs(knobs: Dict[str, Any] | Iterable[str]) -> str:
    """The canonical text of ``knobs`` (a dict, or ``NAME=VALUE`` strings as on the CLI)."""
    if not isinstance(knobs, dict):
        merged: Dict[str, Any] = {}
        for item in knobs:
            for name, value in parse_knobs(item).items():
                if name in merged:
                    raise ConfigError(f"--knob: knob {name!r} is given twice")
                merged[name] = value
        knobs = merged
    for name, value in knobs.items():
        text = _text(value)
        if any(c in text for c in ",\t\n") or not text.strip():
            raise ConfigError(f"knob {name}={text!r}: values may not be empty or contain "
                              "commas or tabs", hint="tuple-valued knobs are set by the driver")
    return ",".join(f"{name}={_text(knobs[name])}" for name in sorted(knobs))


def _check_baseline_knobs(mode: str, knobs: Dict[str, Any], where: str) -> None:
    from end2end.spec.modes import SLAPO_MODES

    if mode not in LEAN_LOSS_MODES:
        raise ConfigError(f"{where}: knobs apply to the Slapo modes and the baselines "
                          f"{', '.join(LEAN_LOSS_MODES)}, not {mode!r}",
                          hint=f"use one of {', '.join(SLAPO_MODES + LEAN_LOSS_MODES)}, or drop "
                          "the knobs (in a config: '#@ knobs=' resets them)")
    for name, value in knobs.items():
        if name not in BASELINE_KNOBS:
            raise ConfigError(f"{where}: knob {name!r} is not a knob of the baseline {mode!r}",
                              hint=f"valid knobs: {', '.join(BASELINE_KNOBS)} (recipe knobs "
                              "apply to the Slapo modes)")
        if not any(value is v for v in BASELINE_KNOBS[name]):  # 1 == True, 1 is not True
            raise ConfigError(f"{where}: {name} must be one of {BASELINE_KNOBS[name]}, got "
                              f"{value!r}", hint=f"e.g. {name}=True")


def check_run_knobs(mode: str, schedule: str, text: str, where: str = "--knob") -> None:
    """Refuse knobs the driver sets, unknown names and invalid common values for the recipe
    ``schedule`` in the Slapo modes, and anything but :data:`BASELINE_KNOBS` in the baselines
    (ConfigError naming the valid knobs)."""
    from slapo.model_schedule import check_knobs, list_knobs

    knobs = parse_knobs(text, where)
    if not knobs:
        return
    from end2end.spec.modes import get_mode

    if not get_mode(mode).slapo:
        _check_baseline_knobs(mode, knobs, where)
        return
    for name in knobs:
        if name in DRIVER_KNOBS:
            raise ConfigError(f"{where}: knob {name!r} is set by the driver",
                              hint=f"use {DRIVER_KNOBS[name]}")
    try:
        check_knobs(schedule, **knobs)
    except ConfigError as exc:
        valid = [k for k in list_knobs(schedule) if k not in DRIVER_KNOBS]
        close = (exc.hint or "").partition("? ")[0] + "? " if "did you mean" in (exc.hint or "") \
            else ""
        hint = f"{close}valid knobs: {', '.join(valid)}" if "unknown knob" in exc.what \
            else exc.hint  # a known knob's value or use: the recipe's own hint
        raise ConfigError(f"{where}: {exc.what} (recipe {schedule!r})", hint=hint) from None
