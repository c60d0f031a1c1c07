"""Eager PyTorch on this CPU: the time of one recorded ATen op, from the ``cpu`` profile's
measurements (:mod:`end2end.simulate.calibrate` measures them; nothing here is fitted to a
config).

A GPU kernel costs its roofline plus a few microseconds of launch. Eager PyTorch on a CPU is
different in three ways that decide small models' speed, and the model states each:

* **Per-op cost.** Every ATen op pays Python, the dispatcher and autograd's bookkeeping
  (forward: recording the graph; backward: the engine) before any arithmetic: of order 5-50 us,
  which for a 4-layer h=512 model is a large share of the step. Measured per phase as the time
  of a chain of tiny ops divided by the ops the simulator's recorder counts in it
  (:attr:`ThreadModel.op_seconds`), and separately for views (:attr:`ThreadModel.view_seconds`:
  a view moves nothing but eager PyTorch still dispatches it and autograd tracks it).
* **GEMM rate by size.** A small GEMM reaches a fraction of the large-GEMM rate. The rate is a
  curve over the FLOPs of one call per kind of op (``mm``: mm/addmm, ``bmm``: bmm/baddbmm,
  ``conv``: convolutions, ``attention``: the CPU's fused SDPA) and dtype, interpolated linearly
  in log-log space between measured points and held constant beyond the ends.
* **Threads.** A 1-rank run uses every core (``torch.get_num_threads()`` of a fresh process);
  ``torchrun`` with more than one process per node sets ``OMP_NUM_THREADS=1`` (its default when
  the variable is unset, which is how the sweep launches), so each rank of a multi-rank run has
  one thread. :func:`threads_per_rank` says which; each thread count has its own measurements.

Elementwise ops move bytes, and some compute more per byte than an ``add``. Moving: ``bytes /
bandwidth(bytes)``, a bandwidth curve over the bytes one op moves (an ``add`` called again and
again: its tensors sit in cache), at most the rank's share of the machine's DRAM bandwidth
(the profile's ``memory_bandwidth``, a 128 MB copy with every core, divided by the ranks on
the machine): in a training step the tensors an op reads were written long before and stream
from DRAM, which the ranks share. Computing: the slowdown per op name is measured for the ops
that compute more per byte (softmax, dropout's random numbers, layer norm, GELU, ...) as the
op's time over an ``add``'s moving the same bytes, at :data:`SLOWDOWN_ELEMENTS` elements, in
cache; what it adds, ``(slowdown - 1) x bytes``, runs at the in-cache rate of that
measurement (the curve at :data:`SLOWDOWN_REFERENCE_BYTES`), whatever the size and the DRAM
cap: drawing random numbers or exponentials is arithmetic, which neither page faults nor the
ranks' shared DRAM slow down. (Multiplying the slowdown by a DRAM-capped or page-fault-bound
bandwidth charged that arithmetic up to the cap's ratio to the cache's rate again: 4x for a
1-thread rank here.)

Per op: ``max(flops / rate(kind, dtype, flops), moving + computing) + per-op cost``.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Dict, Sequence, Tuple

from slapo.errors import ConfigError

__all__ = ["Curve", "ThreadModel", "EagerCpuModel", "gemm_kind", "threads_per_rank",
           "interpolate", "RUNTIME_COSTS", "SLOWDOWN_ELEMENTS", "SLOWDOWN_REFERENCE_BYTES"]

Points = Tuple[Tuple[float, float], ...]

#: costs of a runtime outside the ops the simulator records, charged per unit (the record's
#: ``weight``) at the measured seconds of ``<name>.<phase>``: DeepSpeed ZeRO-3's Python per hooked
#: module, per parameter and per parameter byte (:mod:`end2end.simulate.calibration.zero3`)
RUNTIME_COSTS = ("zero3.module", "zero3.param", "zero3.byte")

#: elements of the calibration's slowdown measurements (fp32;
#: :mod:`~end2end.simulate.calibration.eager`)
SLOWDOWN_ELEMENTS = 2 ** 21
#: bytes an op with one input and one output moves there (most measured ops: softmax, GELU,
#: dropout's draw, layer norm ...): where the slowdown's extra arithmetic is priced
SLOWDOWN_REFERENCE_BYTES = SLOWDOWN_ELEMENTS * 4 * 2

#: ATen op name -> the GEMM curve it uses (other ops with FLOPs use ``mm``)
GEMM_KINDS = {"mm": "mm", "addmm": "mm", "_addmm_activation": "mm", "bmm": "bmm",
              "baddbmm": "bmm", "convolution": "conv", "_convolution": "conv",
              "convolution_backward": "conv", "mkldnn_convolution": "conv",
              "_scaled_dot_product_flash_attention_for_cpu": "attention",
              "_scaled_dot_product_flash_attention_for_cpu_backward": "attention"}


def gemm_kind(name: str) -> str:
    """The curve an op with FLOPs uses (:data:`GEMM_KINDS`; ``mm`` otherwise)."""
    return GEMM_KINDS.get(name, "mm")


def interpolate(points: Sequence[Tuple[float, float]], x: float) -> float:
    """``y(x)`` linear in log-log space between ``points`` (sorted by x, positive), constant
    beyond the first and last point."""
    if not points:
        raise ValueError("no points to interpolate")
    xs = [p[0] for p in points]
    if x <= xs[0]:
        return points[0][1]
    if x >= xs[-1]:
        return points[-1][1]
    i = bisect.bisect_right(xs, x)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))


@dataclasses.dataclass(frozen=True)
class Curve:
    """A measured curve: ``(x, y)`` points sorted by x (both positive), read by
    :func:`interpolate`."""

    points: Points

    def __post_init__(self) -> None:
        pts = tuple(sorted((float(x), float(y)) for x, y in self.points))
        if not pts or any(x <= 0 or y <= 0 for x, y in pts):
            raise ValueError(f"a curve needs positive points, got {self.points}")
        object.__setattr__(self, "points", pts)

    def __call__(self, x: float) -> float:
        return interpolate(self.points, max(x, 1.0))


@dataclasses.dataclass(frozen=True)
class ThreadModel:
    """Eager PyTorch with ``threads`` threads (module docstring). Units: FLOP/s, bytes/s,
    seconds.

    * ``gemm``: dtype name -> kind -> FLOP/s over FLOPs per call;
    * ``bandwidth``: bytes/s of an elementwise ``add`` over the bytes it moves (inputs +
      outputs, as the recorder counts them);
    * ``slowdown``: ATen op name -> how many times longer than an ``add`` moving the same bytes
      it takes (measured; ops not named: 1);
    * ``op_seconds``: phase (``forward``, ``backward``, ``optimizer``) -> seconds per recorded
      op that is not a view, the kernel's own work excluded (tiny tensors);
    * ``view_seconds``: phase -> seconds per recorded view.
    """

    threads: int
    gemm: Dict[str, Dict[str, Curve]]
    bandwidth: Curve
    slowdown: Dict[str, float]
    op_seconds: Dict[str, float]
    view_seconds: Dict[str, float]
    dram_bandwidth: float = 0.0  # bytes/s of DRAM this rank gets (0: no cap; set by for_ranks)
    #: runtime cost -> seconds per unit (``zero3.module.forward`` ...; set by for_ranks from
    #: :attr:`EagerCpuModel.runtime_seconds`)
    runtime_seconds: Dict[str, float] = dataclasses.field(default_factory=dict)

    def rate(self, dtype: str, kind: str, flops: float) -> float:
        """FLOP/s of one call of ``flops`` (float32's curves for a dtype not measured, ``mm``'s
        for a kind not measured)."""
        curves = self.gemm.get(dtype) or self.gemm["float32"]
        return (curves.get(kind) or curves["mm"])(flops)

    def op_time(self, op) -> float:
        """Seconds of one :class:`~end2end.simulate.engine.recorder.OpRecord` (module docstring)."""
        if op.view:
            return self.view_seconds.get(op.phase, 0.0)
        if op.name in RUNTIME_COSTS:  # a modelled runtime's cost: seconds per unit (weight)
            return self.runtime_seconds.get(f"{op.name}.{op.phase}", 0.0)
        work = 0.0
        if op.flops:
            work = op.flops / self.rate(op.dtype, gemm_kind(op.name), op.flops)
        if op.bytes:
            work = max(work, self.elementwise_seconds(op.name, op.bytes))
        return work + self.fixed_seconds(op)

    def elementwise_seconds(self, name: str, nbytes: float) -> float:
        """Seconds of an op named ``name`` moving ``nbytes``: moving them at the size's
        bandwidth (capped at the rank's DRAM share), plus the arithmetic its slowdown measured
        beyond an ``add``'s, at the in-cache rate of that measurement (module docstring)."""
        bandwidth = self.bandwidth(nbytes)
        if self.dram_bandwidth:
            bandwidth = min(bandwidth, self.dram_bandwidth)
        extra = self.slowdown.get(name, 1.0) - 1.0
        computing = nbytes * extra / self.bandwidth(SLOWDOWN_REFERENCE_BYTES)
        return max(nbytes / bandwidth + computing, 0.0)

    def fixed_seconds(self, op) -> float:
        """The per-op cost of a recorded op that is not a view (its phase's ``op_seconds``; a
        modelled runtime cost is all fixed)."""
        if op.name in RUNTIME_COSTS:
            return self.op_time(op)
        return self.op_seconds.get(op.phase, self.op_seconds["forward"])

    def to_json(self) -> dict:
        return dict(threads=self.threads,
                    gemm={d: {k: [list(p) for p in c.points] for k, c in kinds.items()}
                          for d, kinds in self.gemm.items()},
                    bandwidth=[list(p) for p in self.bandwidth.points],
                    slowdown=dict(self.slowdown), op_seconds=dict(self.op_seconds),
                    view_seconds=dict(self.view_seconds))

    @classmethod
    def from_json(cls, data: dict) -> "ThreadModel":
        return cls(int(data["threads"]),
                   {d: {k: Curve(tuple(map(tuple, pts))) for k, pts in kinds.items()}
                    for d, kinds in data["gemm"].items()},
                   Curve(tuple(map(tuple, data["bandwidth"]))),
                   {k: float(v) for k, v in data["slowdown"].items()},
                   {k: float(v) for k, v in data["op_seconds"].items()},
                   {k: float(v) for k, v in data["view_seconds"].items()})


def threads_per_rank(cores: int, ranks_on_node: int) -> int:
    """Threads of one rank as the sweep launches it: all ``cores`` when it is the node's only
    rank, else 1 (``torchrun`` sets ``OMP_NUM_THREADS=1`` for ``--nproc_per_node`` > 1)."""
    return cores if ranks_on_node <= 1 else 1


@dataclasses.dataclass(frozen=True)
class EagerCpuModel:
    """The measured eager-PyTorch model of this CPU: one :class:`ThreadModel` per thread count
    (1 and ``cores``)."""

    cores: int
    per_threads: Dict[int, ThreadModel]
    #: collective kind -> bandwidth (bytes/s) between two local ranks with one thread each, as
    #: the ring model reads it (gloo's all-gather and reduce-scatter are slower than its
    #: all-reduce); kinds not measured use the profile's all-reduce bandwidth
    collective_bandwidth: Dict[str, float] = dataclasses.field(default_factory=dict)
    #: ``zero3.<module|param|byte>.<phase>`` -> seconds per hooked module / parameter /
    #: parameter byte per step that DeepSpeed ZeRO-3 adds on a rank of 2 local ranks with one
    #: thread each (:mod:`end2end.simulate.calibration.zero3`); empty: not measured (costs 0)
    runtime_seconds: Dict[str, float] = dataclasses.field(default_factory=dict)

    def overlaps(self, ranks_on_node: int) -> bool:
        """Whether communication can overlap compute: only with a core to spare for it. Gloo
        moves and reduces the bytes on the CPU; when every core runs a rank's compute thread
        (``ranks_on_node`` >= cores), the two take turns."""
        return ranks_on_node * threads_per_rank(self.cores, ranks_on_node) < self.cores

    def for_ranks(self, ranks_on_node: int, dram_bandwidth: float = 0.0) -> ThreadModel:
        """The measurements for a rank of a run with ``ranks_on_node`` ranks on this machine
        (:func:`threads_per_rank`; the nearest measured thread count), its elementwise
        bandwidth capped at its share of ``dram_bandwidth`` (the machine's, all cores copying:
        a training step's tensors stream from DRAM, which the ranks share)."""
        want = threads_per_rank(self.cores, ranks_on_node)
        if not self.per_threads:
            raise ConfigError("the cpu profile's eager model has no measurements",
                              call="end2end.simulate --device cpu",
                              hint="re-measure: python -m end2end.simulate.calibrate")
        best = min(self.per_threads, key=lambda t: (abs(t - want), t))
        return dataclasses.replace(self.per_threads[best],
                                   dram_bandwidth=dram_bandwidth / max(ranks_on_node, 1),
                                   runtime_seconds=dict(self.runtime_seconds))

    @classmethod
    def constant(cls, cores: int, flops: float, bandwidth: float, op_seconds: float
                 ) -> "EagerCpuModel":
        """A model with one GEMM rate (every core; a rank with one thread: ``flops / cores``),
        one bandwidth and one per-op cost, views free: for tests of the plumbing."""
        def threads(t: int) -> ThreadModel:
            rate = Curve(((1.0, flops * t / cores),))
            return ThreadModel(t, {"float32": {"mm": rate}}, Curve(((1.0, bandwidth),)), {},
                               dict(forward=op_seconds, backward=op_seconds,
                                    optimizer=op_seconds), {})
        return cls(cores, {t: threads(t) for t in sorted({1, cores})})

    def to_json(self) -> dict:
        return dict(cores=self.cores,
                    per_threads={str(t): m.to_json() for t, m in self.per_threads.items()},
                    collective_bandwidth=dict(self.collective_bandwidth),
                    runtime_seconds=dict(self.runtime_seconds))

    @classmethod
    def from_json(cls, data: dict) -> "EagerCpuModel":
        return cls(int(data["cores"]), {int(t): ThreadModel.from_json(m)
                                        for t, m in data["per_threads"].items()},
                   {k: float(v) for k, v in data.get("collective_bandwidth", {}).items()},
                   {k: float(v) for k, v in data.get("runtime_seconds", {}).items()})
