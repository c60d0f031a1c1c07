"""Slapo: a schedule language for progressive optimisation of large model training.

A model stays untouched; a *schedule* created over it applies primitives to modules addressed by
their path, and ``build`` returns an ordinary ``nn.Module``::

    import slapo
    sch = slapo.create_schedule(model)
    sch["encoder.layer.0"].checkpoint()
    model, _ = slapo.build(sch)
"""

from . import primitives as _primitives  # noqa: F401  (registers the built-in primitives)
from .activation_checkpoint import checkpoint
from .build import build
from .errors import (
    AnnotateError,
    BuildError,
    CheckpointError,
    CheckpointIOError,
    ConfigError,
    InitError,
    PathError,
    PatternError,
    PipelineError,
    PrimitiveError,
    RegistryError,
    ReplaceError,
    ShardError,
    SlapoError,
    SyncError,
    TraceError,
    VerifyError,
)
from .history import Deferred, History, HistoryEntry
from .pattern import Subgraph, call_module
from .checkpoint_io import load_checkpoint, save_checkpoint
from .cpu_allocator import keep_freed_memory
from .init import init_empty_weights, materialize
from .primitives.registry import Primitive, list_primitives, register_primitive
from .rng import get_rng_tracker, is_random_seed_set, set_random_seed
from .schedule import Schedule, create_schedule
from . import sharding  # noqa: F401  (slapo.sharding.check_layouts, ...)
from .sharding import check_layouts, reduce_replicated_grads
from .explain import explain
from .verify import Verify, VerifyReport, verify
from .verify_rules import Problem, check_schedule

__version__ = "0.1.0"

__all__ = [
    "create_schedule", "Schedule", "build", "verify", "Verify", "VerifyReport", "explain",
    "check_schedule", "Problem",
    "Primitive", "register_primitive", "list_primitives",
    "History", "HistoryEntry", "Deferred", "Subgraph", "call_module",
    "checkpoint", "init_empty_weights", "materialize", "save_checkpoint", "load_checkpoint",
    "set_random_seed", "get_rng_tracker", "is_random_seed_set",
    "sharding", "check_layouts", "reduce_replicated_grads", "keep_freed_memory",
    "SlapoError", "PathError", "PrimitiveError", "RegistryError", "ReplaceError",
    "CheckpointError", "AnnotateError", "ShardError", "SyncError", "TraceError", "PatternError",
    "PipelineError", "BuildError", "InitError", "CheckpointIOError", "VerifyError", "ConfigError",
]
