"""Let megatron-core 0.16 run on a CPU-only machine (gloo ranks, no GPU).

megatron-core assumes CUDA in a few places on the paths Slapo uses: ``torch.cuda.current_device()``
as an allocation device (rotary embedding, global memory buffer, tensor-parallel layers),
``torch.cuda.synchronize``/``empty_cache``, the CUDA RNG state (its RNG tracker and
``model_parallel_cuda_manual_seed``), and ``device="cuda"`` for the token counter of its
forward-backward schedules. This shim maps each of those to the CPU:

* ``torch.cuda.current_device`` -> ``torch.device("cpu")``; ``synchronize``/``empty_cache`` no-ops;
* ``torch.cuda.{get_rng_state, set_rng_state, manual_seed}`` and megatron's private
  ``tensor_parallel.random._{get,set}_cuda_rng_state`` -> the CPU default generator, so the
  RNG tracker forks CPU streams exactly as it forks CUDA streams on a GPU;
* the ``torch`` name seen by ``megatron.core.pipeline_parallel.{schedules,utils}`` and
  ``megatron.core.transformer.utils`` (token counters, default causal mask) -> a thin proxy whose
  factory functions map ``device="cuda"`` to the CPU (nothing else changes).

Apply it only when no GPU is used (:func:`apply_megatron_cpu_shim` refuses on a CUDA machine unless
forced). It is idempotent and reversible (:func:`remove_megatron_cpu_shim`). Delete it once
megatron-core runs on CPU by itself (documented in ``3rdparty/README.md``).
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Callable, Iterator, List, Tuple

import torch

__all__ = [
    "apply_megatron_cpu_shim",
    "remove_megatron_cpu_shim",
    "megatron_cpu_shim_active",
    "megatron_cpu_shim",
]

_PATCHES: List[Tuple[Any, str, Any]] = []  # (object, attribute, original value)
_CPU = torch.device("cpu")


def megatron_cpu_shim_active() -> bool:
    """Whether the shim is currently applied."""
    return bool(_PATCHES)


def _patch(obj: Any, attr: str, value: Any) -> None:
    _PATCHES.append((obj, attr, getattr(obj, attr)))
    setattr(obj, attr, value)


def _cuda_to_cpu(device: Any) -> Any:
    if isinstance(device, torch.device) and device.type == "cuda":
        return _CPU
    if isinstance(device, str) and device.startswith("cuda"):
        return _CPU
    return device


class _CpuTorchProxy(types.ModuleType):
    """``torch`` for one megatron module, with ``device="cuda"`` in factories mapped to CPU."""

    _FACTORIES = ("zeros", "ones", "empty", "full", "tensor", "arange")

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str) -> Any:
        value = getattr(torch, name)
        if name in self._FACTORIES:
            def factory(*args: Any, _fn: Callable = value, **kwargs: Any) -> Any:
                if "device" in kwargs:
                    kwargs["device"] = _cuda_to_cpu(kwargs["device"])
                return _fn(*args, **kwargs)
            return factory
        return value


def _cpu_get_rng_state(device: Any = "cuda", clone: bool = False,
                       graph_safe: bool = False) -> torch.Tensor:
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state: torch.Tensor, device: Any = -1,
                       graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


def apply_megatron_cpu_shim(force: bool = False) -> bool:
    """Patch megatron-core (and ``torch.cuda``) to run on the CPU; returns whether it is active.

    Does nothing (returns ``False``) when CUDA is available, unless ``force``. Calling it again
    while active is a no-op. Imports megatron-core.
    """
    if _PATCHES:
        return True
    if torch.cuda.is_available() and not force:
        return False
    import megatron.core.pipeline_parallel.schedules as schedules
    import megatron.core.pipeline_parallel.utils as pputils
    import megatron.core.transformer.utils as tutils
    import megatron.core.tensor_parallel.random as mrandom

    _patch(torch.cuda, "current_device", lambda: _CPU)
    _patch(torch.cuda, "synchronize", lambda device=None: None)
    _patch(torch.cuda, "empty_cache", lambda: None)
    _patch(torch.cuda, "get_rng_state", lambda device="cuda": torch.get_rng_state())
    _patch(torch.cuda, "set_rng_state", lambda new_state, device="cuda":
           torch.set_rng_state(new_state))
    _patch(torch.cuda, "manual_seed", lambda seed: torch.manual_seed(seed) and None)
    _patch(mrandom, "_get_cuda_rng_state", _cpu_get_rng_state)
    _patch(mrandom, "_set_cuda_rng_state", _cpu_set_rng_state)
    for mod in (schedules, tutils, pputils):
        _patch(mod, "torch", _CpuTorchProxy())
    return True


def remove_megatron_cpu_shim() -> None:
    """Undo every patch of :func:`apply_megatron_cpu_shim` (no-op when not active)."""
    while _PATCHES:
        obj, attr, original = _PATCHES.pop()
        setattr(obj, attr, original)


@contextlib.contextmanager
def megatron_cpu_shim(force: bool = False) -> Iterator[bool]:
    """Context manager form: applies the shim (if needed) and removes it on exit if it applied
    it."""
    was_active = megatron_cpu_shim_active()
    active = apply_megatron_cpu_shim(force=force)
    try:
        yield active
    finally:
        if active and not was_active:
            remove_megatron_cpu_shim()


