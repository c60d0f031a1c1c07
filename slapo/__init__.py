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
    PortingError,
    TraceError,
    VerifyError,
    PortingImportError,
    original_name,
    register_original_names,
)
from .history import Deferred, History, HistoryEntry
from .primitives.registry import Primitive, list_primitives, register_primitive
from .runtime.activation_checkpoint import checkpoint
from .runtime.checkpoint_policy import SavePolicy
from .runtime.cpu_allocator import keep_freed_memory
from .runtime.distributed import teardown
from .runtime.lifecycle import install_exit_hook as _install_exit_hook
from .runtime.rng import get_rng_tracker, is_random_seed_set, set_random_seed
from .schedule import Schedule, create_schedule
from .sharding import check_layouts, reduce_replicated_grads
from .trace.compute_dtype import compute_dtype
from .trace.pattern import Subgraph, call_module
from .verification.explain import explain
from .verification.rules import Problem, check_schedule
from .verification.verify import Verify, VerifyOptions, VerifyReport, verify
from .weights.checkpoint_io import load_checkpoint, save_checkpoint
from .weights.delayed_init import init_empty_weights, materialize
from .weights.hub_export import export_pretrained
from .weights.hub_load import load_pretrained
from .weights.training_state import TrainingState, load_training_state, save_training_state

__version__ = "0.1.0"

__all__ = [
    "create_schedule", "Schedule", "build", "verify", "Verify", "VerifyOptions", "VerifyReport",
    "explain",
    "check_schedule", "Problem",
    "Primitive", "register_primitive", "list_primitives",
    "History", "HistoryEntry", "Deferred", "Subgraph", "call_module", "compute_dtype",
    "checkpoint", "SavePolicy", "init_empty_weights", "materialize", "save_checkpoint",
    "load_checkpoint",
    "load_pretrained", "export_pretrained", "save_training_state", "load_training_state",
    "TrainingState",
    "set_random_seed", "get_rng_tracker", "is_random_seed_set", "teardown",
    "sharding", "check_layouts", "reduce_replicated_grads", "keep_freed_memory",
    "SlapoError", "PathError", "PrimitiveError", "RegistryError", "ReplaceError",
    "CheckpointError", "AnnotateError", "ShardError", "SyncError", "TraceError", "PatternError",
    "PipelineError", "BuildError", "InitError", "CheckpointIOError", "VerifyError", "ConfigError",
    "PortingError", "PortingImportError",
]

# Names of the original Slapo that are spelled differently here (docs/porting.md); each access
# raises PortingError (an AttributeError) whose hint names ours.
_ORIGINAL_NAMES = {
    "random": "the RNG helpers are top-level: slapo.set_random_seed(seed, tp_rank=...) "
              "(for model_parallel_cuda_manual_seed), slapo.get_rng_tracker() (for "
              "get_cuda_rng_tracker)",
    "get_cuda_rng_tracker": "slapo.get_rng_tracker() (named CPU and CUDA RNG streams)",
    "model_parallel_cuda_manual_seed": "slapo.set_random_seed(seed, tp_rank=...)",
    "get_logger": "logging.getLogger('slapo') (errors are exceptions; per-rank tensor logs: "
                  "slapo.op.TensorLog)",
    "env": "slapo.testing.run_distributed(fn, world_size) spawns ranks (gloo on CPU); "
           "torchrun for real runs",
    "Pattern": "sch.find(pattern) takes any nn.Module (or function) as the pattern",
    "ModulePattern": "slapo.call_module('regex', x) inside a pattern function",
    "pattern": "slapo.call_module (patterns are plain functions or modules)",
    "framework_dialect": "slapo.dialects (slapo.build(sch, target=...))",
    "initialization": "slapo.init_empty_weights and slapo.build(sch, init_weights=...)",
    "ScheduleMetadata": "sch.metadata (a dict keyed by primitive name)",
    "utils": "the benchmark harness measures throughput, memory and TFLOPS "
             "(end2end/driver/bench.py, "
             "end2end/models/flops.py); test helpers are in slapo.testing",
    "Space": "slapo.autotune.Space",
    "Symbol": "slapo.autotune.Symbol",
    "Database": "slapo.autotune.study (an Optuna study on SQLite holds the evaluations)",
}


register_original_names("slapo", _ORIGINAL_NAMES)
_install_exit_hook()  # a clean exit after collectives (slapo.runtime.lifecycle says why)


def __getattr__(name: str):
    raise original_name("slapo", name, _ORIGINAL_NAMES)
