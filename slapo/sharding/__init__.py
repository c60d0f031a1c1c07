"""Tensor-parallel sharding: per-tensor shard specs, autograd-aware collectives, shard rules,
activation layouts and sequence parallelism. See ``docs/internals.md`` ("Tensor parallelism")."""

from ..errors import original_name, register_original_names
from .collectives import (
    all_gather_forward_reduce_scatter_backward,
    all_gather_forward_split_backward,
    all_reduce_forward_identity_backward,
    all_to_all_forward_inverse_all_to_all_backward,
    identity_forward_all_reduce_backward,
    reduce_scatter_forward_all_gather_backward,
    split_forward_all_gather_backward,
)
from .layout import Layout, LayoutProblem, ModuleLayout, ShardInfo, SyncRecord
from .layout_check import check_layouts
from .rules import HeadRule, ShardRule, register_head_rule, register_shard_rule, rule_for
from .sequence_parallel import (
    gather_sequence,
    mark_replicated,
    reduce_replicated_grads,
    reduce_scatter_sequence,
    scatter_sequence,
)
from .spec import SHARD_ATTR, ShardSpec, get_shard_spec, set_shard_spec

__all__ = [
    "ShardSpec", "SHARD_ATTR", "get_shard_spec", "set_shard_spec",
    "all_reduce_forward_identity_backward", "identity_forward_all_reduce_backward",
    "all_gather_forward_split_backward", "all_gather_forward_reduce_scatter_backward",
    "reduce_scatter_forward_all_gather_backward", "split_forward_all_gather_backward",
    "all_to_all_forward_inverse_all_to_all_backward",
    "Layout", "ModuleLayout", "ShardInfo", "SyncRecord", "LayoutProblem", "check_layouts",
    "ShardRule", "HeadRule", "register_shard_rule", "register_head_rule", "rule_for",
    "scatter_sequence", "gather_sequence", "reduce_scatter_sequence", "mark_replicated",
    "reduce_replicated_grads",
]

# The original Slapo's slapo.sharding names, spelled differently here (docs/porting.md): our
# collectives name their backward.
_ORIGINAL_NAMES = {
    "all_gather_forward_output": "slapo.sharding.all_gather_forward_reduce_scatter_backward "
                                 "(tensor_parallel_output_grad=True, the original's default) or "
                                 "all_gather_forward_split_backward (False)",
    "reduce_scatter_forward_output": "slapo.sharding.reduce_scatter_forward_all_gather_backward",
    "scatter_forward_output": "slapo.sharding.split_forward_all_gather_backward",
    "reduce_forward_output": "slapo.sharding.all_reduce_forward_identity_backward",
    "reduce_backward_grad": "slapo.sharding.identity_forward_all_reduce_backward",
    "parse_reshard": "sch.sync(mode, 'all_gather' | 'scatter' | 'all_to_all', ...) or the "
                     "collectives themselves, e.g. "
                     "slapo.sharding.all_to_all_forward_inverse_all_to_all_backward",
    "register_shard_method": "slapo.sharding.register_shard_rule",
}
register_original_names("slapo.sharding", _ORIGINAL_NAMES)


def __getattr__(name: str):
    raise original_name("slapo.sharding", name, _ORIGINAL_NAMES)
