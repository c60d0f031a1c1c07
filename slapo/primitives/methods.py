"""The built-in primitives as methods that ``Schedule`` inherits.

Each line declares one registered primitive on the class, so the method exists before any
schedule is made and a type checker knows it (``sch.shard("weight", axis=0)`` is checked against
``Shard.apply``). The signature and docstring are those of the primitive's ``apply``: written
once, in the primitive's module. Adding a built-in: its module (imported in ``__init__.py``) and
one line here (``tests/test_schedule.py`` checks that none is missing).
"""

from __future__ import annotations

from .all_reduce_grads import AllReduceGrads
from .annotate import Annotate
from .checkpoint import Checkpoint
from .cut_pipeline_stage import CutPipelineStage
from .decompose import Decompose
from .find import Find
from .fork_rng import ForkRng
from .fuse import Fuse
from .registry import primitive_method
from .replace import Replace
from .replace_all import ReplaceAll
from .shard import Shard
from .sync import Sync
from .trace import Trace, TraceUntil

__all__ = ["PrimitiveMethods"]


class PrimitiveMethods:
    """Base class of :class:`slapo.Schedule` holding the built-in primitives (see each
    method's docstring: preconditions, the schedule before and after, the errors raised)."""

    replace = primitive_method(Replace.apply)
    replace_all = primitive_method(ReplaceAll.apply)
    shard = primitive_method(Shard.apply)
    sync = primitive_method(Sync.apply)
    all_reduce_grads = primitive_method(AllReduceGrads.apply)
    checkpoint = primitive_method(Checkpoint.apply)
    fork_rng = primitive_method(ForkRng.apply)
    annotate = primitive_method(Annotate.apply)
    trace = primitive_method(Trace.apply)
    trace_until = primitive_method(TraceUntil.apply)
    find = primitive_method(Find.apply)
    fuse = primitive_method(Fuse.apply)
    decompose = primitive_method(Decompose.apply)
    cut_pipeline_stage = primitive_method(CutPipelineStage.apply)
