"""Named random-number streams for tensor parallelism, on CPU and CUDA.

Outside a tensor-parallel region every rank must draw the same random numbers (e.g. dropout on a
replicated activation); inside one (e.g. dropout on attention heads split across ranks) each rank
must draw different ones. The tracker keeps named generator states; ``fork(name)`` swaps the
default generators (CPU, and the current CUDA device when available) to the named stream for the
duration of the block and saves the advanced state back, so the default stream is unaffected.

``set_random_seed(seed, tp_rank=r)`` seeds the default stream identically on all TP ranks and the
``"model-parallel-rng"`` stream with a per-rank seed.
"""

from __future__ import annotations

import contextlib
import random
from typing import Dict, Iterator, Optional

import torch

from ..errors import SlapoError

__all__ = [
    "RNGStatesTracker",
    "get_rng_tracker",
    "set_random_seed",
    "is_random_seed_set",
    "MODEL_PARALLEL_RNG",
    "TP_SEED_OFFSET",
]

MODEL_PARALLEL_RNG = "model-parallel-rng"
TP_SEED_OFFSET = 2718


def _cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _get_state() -> Dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if _cuda():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_state(state: Dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and _cuda():
        torch.cuda.set_rng_state(state["cuda"])


class RNGStatesTracker:
    """Named RNG states (CPU + current CUDA device), Megatron-style."""

    def __init__(self) -> None:
        self.states: Dict[str, Dict[str, torch.Tensor]] = {}
        self.seeds: Dict[str, int] = {}

    def reset(self) -> None:
        """Forget every stream."""
        self.states.clear()
        self.seeds.clear()

    def add(self, name: str, seed: int) -> None:
        """Create stream ``name`` seeded with ``seed`` (names and seeds must be unique)."""
        if name in self.states:
            raise SlapoError(f"RNG stream '{name}' already exists", hint="call reset() first")
        if seed in self.seeds.values():
            raise SlapoError(f"seed {seed} is already used by another RNG stream",
                             hint="use distinct seeds per stream")
        saved = _get_state()
        torch.manual_seed(seed)
        self.states[name] = _get_state()
        self.seeds[name] = seed
        _set_state(saved)

    def get_states(self) -> Dict[str, Dict[str, torch.Tensor]]:
        """A copy of every stream's state. The state tensors are shared, not cloned: the tracker
        never writes into one (it stores a fresh ``torch.get_rng_state()``), and a clone made
        under a fake-tensor mode (the simulator's) would be a fake tensor that
        ``torch.set_rng_state`` cannot read."""
        return {k: dict(v) for k, v in self.states.items()}

    def set_states(self, states: Dict[str, Dict[str, torch.Tensor]]) -> None:
        """Restore states returned by :meth:`get_states`."""
        self.states = {k: dict(v) for k, v in states.items()}

    @contextlib.contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG) -> Iterator[None]:
        """Run the block on stream ``name``; the default stream is left as it was."""
        if name not in self.states:
            raise SlapoError(
                f"RNG stream '{name}' does not exist",
                call="fork_rng",
                hint="call slapo.set_random_seed(seed, tp_rank=...) before running the model",
            )
        saved = _get_state()
        _set_state(self.states[name])
        try:
            yield
        finally:
            self.states[name] = _get_state()
            _set_state(saved)


_TRACKER = RNGStatesTracker()


def get_rng_tracker() -> RNGStatesTracker:
    """The process-wide tracker."""
    return _TRACKER


def is_random_seed_set() -> bool:
    """Whether ``set_random_seed`` created the model-parallel stream."""
    return bool(_TRACKER.states)


def set_random_seed(
    seed: int = 2013,
    *,
    dp_rank: int = 0,
    pp_rank: int = 0,
    tp_rank: Optional[int] = None,
    always_enable_tp_seed: bool = False,
) -> int:
    """Seed python, numpy and torch; with ``tp_rank``, also the per-rank model-parallel stream.

    The default stream gets ``seed + 100 * pp_rank + 10 * dp_rank`` (identical across TP ranks;
    per TP rank too when ``always_enable_tp_seed``, as sequence parallelism needs); the
    ``model-parallel-rng`` stream gets that plus ``2718 + tp_rank``. Returns the default seed.
    """
    seed = seed + 100 * pp_rank + 10 * dp_rank
    tp_seed = None if tp_rank is None else seed + TP_SEED_OFFSET + tp_rank
    default_seed = tp_seed if (always_enable_tp_seed and tp_seed is not None) else seed
    random.seed(default_seed)
    try:
        import numpy as np

        np.random.seed(default_seed % (2**32))
    except ImportError:  # pragma: no cover - numpy is optional
        pass
    torch.manual_seed(default_seed)
    _TRACKER.reset()
    if tp_seed is not None:
        _TRACKER.add(MODEL_PARALLEL_RNG, tp_seed)
    return default_seed
