"""The time of one recorded kernel on a GPU profile (the ``cpu`` profile has its own model,
:mod:`end2end.simulate.cost.cpu_model`).

Per kernel a roofline, ``max(FLOPs / (peak(dtype) x efficiency), bytes / (HBM x
memory_efficiency)) + kernel_overhead``, where the efficiency depends on the kernel:

* **GEMMs** (``mm``, ``addmm``, ``bmm``, ``baddbmm``: the recorder keeps their ``batch x M x N x
  K``): the large-GEMM efficiency of the op's dtype (the best-shaped large GEMM's measured
  fraction of the peak, ``DeviceProfile.gemm_efficiency_of``) times the *tile and wave
  quantisation* of NVIDIA's "Matrix Multiplication Background" guide
  (docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication): the output
  is computed in tiles of ``Mt x Nt`` (cuBLAS's typical tiles: 256x128, 128x256,
  128x128, 128x64, 64x128, 64x64), one tile per SM at a time, so a GEMM takes
  ``ceil(tiles / SMs)`` waves of full tiles. The useful fraction is ``B M N / (waves x SMs x
  Mt x Nt)``; the tile with the largest fraction is taken (cuBLAS's heuristics choose among
  them). A 4096 x 4096 output on 108 SMs keeps ~99 %; a per-rank tensor-parallel GEMM of
  1024 x 640 on 108 SMs ~93 %; a 128 x 128 x 64 attention GEMM per head far less.
* **fused attention** (``_scaled_dot_product_flash_attention``, ``..._efficient_attention`` and
  their backwards): the profile's ``attention_efficiency`` of the kernel kind.
* any other op with FLOPs (convolutions): the ``gemm_efficiency`` of its dtype.

The bytes move at the profile's ``memory_efficiency`` (a streaming kernel's measured fraction
of the HBM bandwidth) except in the *row reductions* (:data:`REDUCTION_KERNELS`: softmax,
log-softmax, layer, group and RMS norm and their backwards): one block reduces a row, then
rescales it, so they reach less of the bandwidth than a stream; they move their bytes at the
profile's ``reduction_efficiency`` of their direction (``forward``, ``backward``: PyTorch's own
kernels measured, :data:`end2end.simulate.cost.profiles.SOURCES`).

Views and allocations (``empty``, ``empty_like``, ``empty_strided``, ``new_empty``,
``new_empty_strided``: the caching allocator hands out memory, no kernel runs; PyTorch's
``aten/src/ATen/native/TensorFactories.cpp`` launches none for them; ``_unsafe_view``, a view
that autograd does not track as one) cost nothing on the GPU; runtime costs measured on a CPU
(:data:`cpu_model.RUNTIME_COSTS`) are not charged. The host: eager PyTorch issues every kernel
from Python (``host_op_s`` per op, the profile's), so a phase takes at least its ops x that
(:func:`phase_seconds`).
"""

from __future__ import annotations

import functools
import math
from typing import Dict, Iterable, Tuple

from end2end.simulate.cost.cpu_model import RUNTIME_COSTS
from end2end.simulate.cost.records import OpRecord

__all__ = ["NO_KERNEL", "TILES", "GEMM_SHAPED", "gemm_shape", "tile_utilisation",
           "kernel_efficiency", "kernel_seconds", "phase_seconds", "ATTENTION_KINDS",
           "REDUCTION_KERNELS", "bandwidth_efficiency"]

#: cuBLAS's typical output tiles (NVIDIA's Matrix Multiplication Background guide, section 2.3)
TILES: Tuple[Tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128),
                                      (64, 64))

#: ATen GEMMs whose shape the recorder keeps: name -> positions of (A, B) among the arguments
GEMM_SHAPED: Dict[str, Tuple[int, int]] = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2),
                                           "baddbmm": (1, 2), "_addmm_activation": (1, 2)}

#: ATen ops that allocate without launching a kernel (module docstring)
NO_KERNEL = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                       "_unsafe_view"})

#: fused attention ops -> the kernel kind of ``attention_efficiency``
ATTENTION_KINDS = {"_scaled_dot_product_flash_attention": "flash",
                   "_scaled_dot_product_flash_attention_backward": "flash",
                   "_scaled_dot_product_efficient_attention": "efficient",
                   "_scaled_dot_product_efficient_attention_backward": "efficient"}


#: row-reduction ATen kernels -> the direction of ``reduction_efficiency`` they move bytes at
#: (module docstring); batch norm is not here: it reduces over the batch, another kernel
REDUCTION_KERNELS = {**dict.fromkeys(("_softmax", "_safe_softmax", "_log_softmax",
                                      "native_layer_norm", "native_group_norm",
                                      "_fused_rms_norm"), "forward"),
                     **dict.fromkeys(("_softmax_backward_data", "_log_softmax_backward_data",
                                      "native_layer_norm_backward", "native_group_norm_backward",
                                      "_fused_rms_norm_backward"), "backward")}


def gemm_shape(name: str, args) -> Tuple[int, ...]:
    """``(batch, M, N, K)`` of a GEMM call (``()`` for other ops or unexpected arguments)."""
    where = GEMM_SHAPED.get(name)
    if where is None:
        return ()
    try:
        a, b = args[where[0]], args[where[1]]
        *batch_a, m, k = a.shape
        n = b.shape[-1]
    except (IndexError, AttributeError, ValueError):
        return ()
    batch = math.prod(batch_a) if batch_a else 1
    return (int(batch), int(m), int(n), int(k))


@functools.lru_cache(maxsize=4096)
def tile_utilisation(shape: Tuple[int, ...], sms: int) -> float:
    """The useful fraction of the SMs' tile slots for a GEMM of ``shape`` (module docstring)."""
    if not shape or sms <= 0:
        return 1.0
    batch, m, n, _ = shape
    best = 0.0
    for mt, nt in TILES:
        tiles = batch * math.ceil(m / mt) * math.ceil(n / nt)
        waves = math.ceil(tiles / sms)
        best = max(best, batch * m * n / (waves * sms * mt * nt))
    return best


def kernel_efficiency(op: OpRecord, profile) -> float:
    """The fraction of the dtype's peak ``op`` reaches on ``profile`` (module docstring)."""
    kind = ATTENTION_KINDS.get(op.name)
    if kind is not None and kind in profile.attention_efficiency:
        return profile.attention_efficiency[kind]
    return profile.gemm_efficiency_of(op.dtype) * tile_utilisation(op.shape, profile.sm_count)


def bandwidth_efficiency(op: OpRecord, profile) -> float:
    """The fraction of the HBM bandwidth ``op``'s bytes move at on ``profile`` (module
    docstring): its direction's ``reduction_efficiency`` for a row reduction the profile has
    one for, else ``memory_efficiency``."""
    direction = REDUCTION_KERNELS.get(op.name)
    if direction is not None and direction in profile.reduction_efficiency:
        return profile.reduction_efficiency[direction]
    return profile.memory_efficiency


def kernel_seconds(op: OpRecord, profile) -> float:
    """Seconds of one kernel on a GPU profile (0 for views, allocations and CPU-measured
    runtime costs)."""
    if op.view or op.name in RUNTIME_COSTS or op.name in NO_KERNEL:
        return 0.0
    compute = op.flops / (profile.rate(op.dtype) * kernel_efficiency(op, profile)) \
        if op.flops else 0.0
    memory = op.bytes / (profile.memory_bandwidth * bandwidth_efficiency(op, profile))
    return max(compute, memory) + profile.kernel_overhead_s


def phase_seconds(ops: Iterable[OpRecord], profile) -> Dict[str, float]:
    """Seconds per phase on a GPU profile: the kernels' sum, at least the host's time to issue
    them (``host_op_s`` per non-view op: eager PyTorch)."""
    gpu: Dict[str, float] = {}
    host: Dict[str, float] = {}
    for op in ops:
        if op.view or op.name in RUNTIME_COSTS:
            continue
        gpu[op.phase] = gpu.get(op.phase, 0.0) + kernel_seconds(op, profile) * op.weight
        host[op.phase] = host.get(op.phase, 0.0) + profile.host_op_s * op.weight
    return {phase: max(t, host[phase]) for phase, t in gpu.items()}
