"""Pieces shared by the runtime dialects: pipeline-cut detection, optimizers, tensor-parallel
layouts and the data-parallel groups that go with them."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn

from ..runtime.distributed import default_timeout
from ..errors import BuildError
from ..sharding.spec import get_shard_spec

__all__ = [
    "has_pipeline_cuts",
    "reject_pipeline_cuts",
    "reject_pipeline_options",
    "pipeline_groups",
    "make_optimizer",
    "has_tp_shards",
    "tp_ranks",
    "data_parallel_group",
    "tensor_parallel_layouts",
    "tag_tensor_parallel_params",
    "OptimizerArg",
]

OptimizerArg = Union[None, torch.optim.Optimizer, Callable[[List[nn.Parameter]], Any]]


def has_pipeline_cuts(sch) -> bool:
    """Whether any position of the schedule carries a ``cut_pipeline_stage`` mark."""
    return any("cut_pipeline_stage" in node.metadata for _, node in sch.named_schedules())


def reject_pipeline_cuts(sch, target: str) -> None:
    """Raise :class:`BuildError` for a schedule with pipeline cuts (not supported yet)."""
    if has_pipeline_cuts(sch):
        raise BuildError(
            f"schedules with pipeline stages (cut_pipeline_stage) are not yet supported by "
            f"target '{target}'", call=f"build(target={target!r})",
            hint="build pipelines with target 'torch' or 'deepspeed', or remove the "
                 "cut_pipeline_stage calls (tensor and data parallelism work)",
        )


def reject_pipeline_options(target: str, **options: Any) -> None:
    """Raise :class:`BuildError` when pipeline-only ``options`` (those not ``None``) are given
    for a schedule without pipeline cuts."""
    given = sorted(k for k, v in options.items() if v is not None)
    if given:
        raise BuildError(
            f"option(s) {', '.join(given)} of target '{target}' only apply to schedules with "
            "pipeline cuts", call=f"build(target={target!r})",
            hint="mark stage ends with sch['<path>'].cut_pipeline_stage(), or drop the option(s)")


def pipeline_groups(sch, model: nn.Module, num_stages: int, target: str):
    """The :class:`~slapo.dialects.layout.LayoutGroups` of a pipelined schedule: tensor-parallel
    size = the schedule's group (1 when it has none and nothing is sharded), ``num_stages``
    stages, data parallelism over the rest of the world. Initialises ``torch.distributed`` if
    needed; collective over the world.

    Raises:
        BuildError: the world is not a multiple of tp x stages; the schedule's group is not this
            rank's block of consecutive ranks; a model sharded over the whole world.
    """
    from ..runtime.distributed import init_distributed, register_teardown
    from .layout import ParallelLayout, _reset_groups, create_groups

    env = init_distributed()
    call = f"build(target={target!r})"
    if sch.group is None:
        if has_tp_shards(model):
            raise BuildError(
                "the schedule is sharded over the whole world (group=None), which leaves no "
                "ranks for its pipeline stages", call=call,
                hint="create the schedule with create_schedule(model, group=tp_group), tp_group "
                     "being this rank's block of tp consecutive ranks")
        tp = 1
    else:
        tp = len(tp_ranks(sch.group))
    layout = ParallelLayout.for_world(env.world_size, tp, num_stages)
    expected = layout.group_of(layout.tp_groups(), env.rank)
    if sch.group is not None and tp_ranks(sch.group) != expected:
        raise BuildError(
            f"the schedule's tensor-parallel group {tp_ranks(sch.group)} is not rank "
            f"{env.rank}'s block {expected} of the pipeline layout {layout}", call=call,
            hint="tensor-parallel groups must be blocks of consecutive ranks: rank r belongs to "
                 "[r // tp * tp, ..., r // tp * tp + tp - 1] (see slapo.dialects.layout)")
    register_teardown(_reset_groups)
    return create_groups(layout)


def make_optimizer(model: nn.Module, optimizer: OptimizerArg) -> torch.optim.Optimizer:
    """``optimizer`` as an optimizer over ``model``'s trainable parameters: an optimizer is
    returned as is, a factory ``fn(params)`` is called, ``None`` gives ``torch.optim.AdamW``
    with its defaults (a plain torch optimizer: nothing needs a C++ build)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer is None:
        return torch.optim.AdamW(params)
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if callable(optimizer):
        return optimizer(params)
    raise BuildError(f"optimizer must be an optimizer or a factory fn(params) -> Optimizer, "
                     f"got {type(optimizer).__name__}", call="build",
                     hint="e.g. optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1)")


def has_tp_shards(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` is a tensor-parallel shard (a Slapo ShardSpec, or
    megatron's ``tensor_model_parallel`` mark)."""
    return any(get_shard_spec(p) is not None or getattr(p, "tensor_model_parallel", False)
               for p in model.parameters())


def tp_ranks(group: Optional[dist.ProcessGroup]) -> List[int]:
    """Global ranks of the tensor-parallel ``group`` (``None`` = the whole world)."""
    if group is None:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


def tensor_parallel_layouts(mine: List[int]) -> List[List[int]]:
    """Every rank's tensor-parallel group (its global ranks), in rank order, given this rank's
    ``mine``: an object all-gather over the world (collective)."""
    layouts: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(layouts, mine)
    return layouts


_DP_GROUPS: Dict[Tuple[Tuple[int, ...], ...], dist.ProcessGroup] = {}


def data_parallel_group(tp_group: Optional[dist.ProcessGroup]) -> dist.ProcessGroup:
    """The data-parallel group that goes with ``tp_group``: the ranks holding the same
    tensor-parallel rank (position) in every tensor-parallel group. Collective over the world.

    Raises:
        BuildError: the tensor-parallel groups do not split the world into equal parts.
    """
    mine = tp_ranks(tp_group)
    groups = sorted({tuple(g) for g in tensor_parallel_layouts(mine)})
    covered = sorted(r for g in groups for r in g)
    if covered != list(range(dist.get_world_size())) or len({len(g) for g in groups}) != 1:
        raise BuildError(
            f"the tensor-parallel groups {groups} do not split the world into equal, disjoint "
            "groups", call="build",
            hint="create one tensor-parallel group per block of ranks, of the same size, and pass "
                 "each rank's own group to create_schedule(model, group=...)")
    key = tuple(groups)
    if key not in _DP_GROUPS:
        from ..runtime.distributed import register_teardown

        register_teardown(_DP_GROUPS.clear)  # slapo.teardown() lets go of the cached groups
        pos = mine.index(dist.get_rank())
        for i in range(len(groups[0])):  # every rank creates every group, in the same order
            grp = dist.new_group([g[i] for g in groups], timeout=default_timeout())
            if i == pos:
                _DP_GROUPS[key] = grp
    return _DP_GROUPS[key]


def tag_tensor_parallel_params(model: nn.Module) -> None:
    """Mark shards the way DeepSpeed and Megatron recognise model-parallel parameters
    (``tensor_model_parallel``, ``partition_dim``, ``partition_stride``), so that gradient-norm
    and checkpoint code does not count a shard as a replica."""
    for p in model.parameters():
        spec = get_shard_spec(p)
        if spec is not None:
            p.tensor_model_parallel = True
            p.partition_dim = spec.axis
            p.partition_stride = 1
