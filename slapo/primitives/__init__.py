"""Built-in primitives. Each module registers one primitive; the imports below are the registry's
explicit list (no directory scanning). Add a new built-in by importing its module here."""

from . import annotate, checkpoint, replace, replace_all  # noqa: F401  (register)
from . import fork_rng, shard, sync  # noqa: F401  (register: tensor parallelism)
from . import all_reduce_grads  # noqa: F401  (register: gradients of replicated parameters)
from . import cut_pipeline_stage, decompose, find, fuse, trace  # noqa: F401  (trace-by-need)
from .registry import Primitive, get_primitive, list_primitives, register_primitive

__all__ = ["Primitive", "register_primitive", "list_primitives", "get_primitive"]
