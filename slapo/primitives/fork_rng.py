"""``fork_rng``: run a module on the per-rank (model-parallel) RNG stream."""

from __future__ import annotations

from typing import Any, Callable

from ..errors import PrimitiveError
from ..runtime.forward_wrap import has_forward_wrapper, install_forward_wrapper
from ..runtime.rng import MODEL_PARALLEL_RNG, get_rng_tracker
from .module_checks import format_call
from .registry import Primitive, register_primitive

__all__ = ["ForkRng", "ForkedRngForward"]


class ForkedRngForward:
    """Forward wrapper: run the module inside ``get_rng_tracker().fork()``.

    A module-level class (not a closure) so the model stays deep-copyable and picklable; it keeps
    the module path for the error raised when the stream is missing.
    """

    def __init__(self, path: str):
        self.path = path

    def __call__(self, inner: Callable, *args: Any, **kwargs: Any) -> Any:
        tracker = get_rng_tracker()
        if MODEL_PARALLEL_RNG not in tracker.states:
            raise PrimitiveError(
                f"the '{MODEL_PARALLEL_RNG}' RNG stream does not exist, so this rank cannot draw "
                "its own random numbers", path=self.path, call="fork_rng()",
                hint="call slapo.set_random_seed(seed, tp_rank=<tensor-parallel rank>) on every "
                "rank before running the model")
        with tracker.fork(MODEL_PARALLEL_RNG):
            return inner(*args, **kwargs)


@register_primitive
class ForkRng(Primitive):
    name = "fork_rng"

    @staticmethod
    def apply(sch) -> None:
        """Draw this module's random numbers (e.g. dropout) from the per-rank RNG stream.

        Inside a tensor-parallel region (e.g. attention probabilities of this rank's heads) each
        rank must draw *different* dropout masks; outside one, ranks must draw the same. The
        module's forward runs inside ``slapo.get_rng_tracker().fork()``: the default CPU (and
        CUDA) generators are swapped to the ``model-parallel-rng`` stream that
        ``slapo.set_random_seed(seed, tp_rank=r)`` seeds per rank, and back afterwards, so the
        default stream is untouched. Composes with ``checkpoint`` (recomputation draws the same
        masks). Path, hooks and state-dict keys are unchanged; tracers treat the module as a
        leaf.

        Before: the module draws from the default stream. After: from the per-rank stream.

        Raises:
            PrimitiveError: the module already forks the RNG; at run time, if
                ``set_random_seed(..., tp_rank=...)`` was not called.
        """
        if has_forward_wrapper(sch.mod, "fork_rng"):
            raise PrimitiveError("the module already runs on the forked RNG stream",
                                 path=sch.path, call=format_call("fork_rng"), module=sch.mod,
                                 hint="call fork_rng() once per module")
        install_forward_wrapper(sch.mod, "fork_rng", ForkedRngForward(sch.path))
        sch.metadata["fork_rng"] = True
