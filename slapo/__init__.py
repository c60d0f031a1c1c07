"""Slapo: a schedule language for progressive optimisation of large model training.

A model stays untouched; a *schedule* created over it applies primitives to modules addressed by
their path, and ``build`` returns an ordinary ``nn.Module``::

    import slapo
    sch = slapo.create_schedule(model)
    sch["encoder.layer.0"].checkpoint()
    model, _ = slapo.build(sch)
"""

from . import primitives as _primitives  # noqa: F401  (registers the built-in primitives)
from . import sharding  # public: slapo.sharding.check_layouts, ...
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
from .primitives.registry import Primitive, list_primitives, register_primitive
from .runtime.activation_checkpoint import checkpoint
from .runtime.cpu_allocator import keep_freed_memory
from .runtime.rng import get_rng_tracker, is_random_seed_set, set_random_seed
from .schedule import Schedule, create_schedule
from .sharding import check_layouts, reduce_replicated_grads
from .trace.pattern import Subgraph, call_module
from .verification.explain import explain
from .verification.rules import Problem, check_schedule
from .verification.verify import Verify, VerifyReport, verify
from .weights.checkpoint_io import load_checkpoint, save_checkpoint
from .weights.delayed_init import init_empty_weights, materialize

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
