"""Pipeline cuts the recipes share: where ``pipeline_cuts`` ends stages, checked, then cut.

:func:`pipeline_cut_paths` turns the knob (layer indices, one list per stack) into layer paths
and refuses a bad one before anything changes; :func:`cut_pipeline_at` traces the modules that
call those layers (``trace_until``: the cut needs their graph) and cuts a stage after each;
:func:`cut_pipeline` is both. Re-exported by :mod:`slapo.model_schedule.common`.
"""

from __future__ import annotations

from typing import Any, List, Sequence

from torch import nn

from ..errors import ConfigError
from ..schedule import Schedule
from .config import ScheduleConfig

__all__ = ["cut_pipeline", "pipeline_cut_paths", "cut_pipeline_at", "caller_of"]


def caller_of(sch: Schedule, layer: str) -> str:
    """The module whose forward calls ``layer`` (skipping ModuleList/ModuleDict containers)."""
    node = sch[layer].parent
    assert node is not None, "a layer is never the root"
    while isinstance(node.mod, (nn.ModuleList, nn.ModuleDict)) and node.parent is not None:
        node = node.parent
    return node.path


def cut_pipeline(sch: Schedule, cfg: ScheduleConfig, stacks: Sequence[Sequence[str]],
                 family: str, example_inputs: Any = None) -> None:
    """Cut a pipeline stage after the layers in ``cfg.pipeline_cuts``: layer indices for a
    single stack, or one list per stack (T5: ``[[encoder...], [decoder...]]``; WideResNet: four
    lists). The modules calling the layers are traced first (``trace_until``), which needs
    ``example_inputs`` (the model's keyword inputs).

    Raises:
        ConfigError: as :func:`pipeline_cut_paths`.
    """
    cut_pipeline_at(sch, pipeline_cut_paths(sch, cfg, stacks, family, example_inputs),
                    example_inputs)


def pipeline_cut_paths(sch: Schedule, cfg: ScheduleConfig, stacks: Sequence[Sequence[str]],
                       family: str, example_inputs: Any = None) -> List[str]:
    """The layer paths ``cfg.pipeline_cuts`` ends stages after (empty without cuts), checked
    without changing anything.

    Raises:
        ConfigError: cuts without ``example_inputs``, a family without stacks to cut, a wrong
            shape of ``pipeline_cuts`` or an index out of range.
    """
    cuts: Sequence[Any] = cfg.pipeline_cuts  # layer indices, or one list of them per stack
    if not cuts:
        return []
    call = f"apply_schedule({family!r}, pipeline_cuts={list(cuts)})"
    if not stacks:
        raise ConfigError(f"pipeline cuts are not supported for {family}", call=call,
                          hint="its layers share one module (ALBERT): drop pipeline_cuts")
    nested = all(isinstance(c, (list, tuple)) for c in cuts)
    per_stack = [list(c) for c in cuts] if nested else [list(cuts)]
    if len(per_stack) != len(stacks):
        raise ConfigError(f"pipeline_cuts needs {len(stacks)} list(s) of layer indices (one per "
                          "stack)" if len(stacks) > 1 else "pipeline_cuts must be layer indices",
                          call=call, hint="e.g. pipeline_cuts=[3] cuts after layer 3")
    if example_inputs is None:
        raise ConfigError("pipeline_cuts needs example_inputs=<the model's inputs> to trace the "
                          "modules that call the layers", call=call,
                          hint="pass example_inputs=dict(input_ids=..., ...)")
    plan = []
    for stack, indices in zip(stacks, per_stack):
        bad = [c for c in indices if not (isinstance(c, int) and 0 <= c < len(stack))]
        if bad:
            raise ConfigError(f"pipeline cut(s) {bad} are not layer indices in "
                              f"0..{len(stack) - 1}", call=call,
                              hint="a cut index i ends a stage after layer i")
        plan += [stack[i] for i in sorted(set(indices))]
    return plan


def cut_pipeline_at(sch: Schedule, paths: Sequence[str], example_inputs: Any) -> None:
    """Trace the modules calling the layers at ``paths`` and cut a stage after each (the
    checked result of :func:`pipeline_cut_paths`; nothing when empty)."""
    if not paths:
        return
    callers = sorted({caller_of(sch, path) for path in paths})
    sch.trace_until(callers, example_inputs=example_inputs)
    for path in paths:
        sch[path].cut_pipeline_stage()
