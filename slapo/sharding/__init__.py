"""Tensor-parallel sharding: per-tensor shard specs, autograd-aware collectives, shard rules."""

from .spec import SHARD_ATTR, ShardSpec, get_shard_spec, set_shard_spec

__all__ = ["ShardSpec", "SHARD_ATTR", "get_shard_spec", "set_shard_spec"]
