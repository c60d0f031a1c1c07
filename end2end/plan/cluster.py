"""The cluster a run is planned for: ``PROFILE:GPUSxNODES`` (``h100-80gb:8x4``).

``PROFILE`` is a device profile of the simulator (:mod:`end2end.simulate.profiles`; ``cpu`` is
this machine, its calibration file given apart), ``GPUS`` the GPUs per node and ``NODES`` the
nodes: ``h100-80gb:8x4`` is 32 H100s in 4 nodes of 8. ``PROFILE`` alone means one node of the
profile's own size (``h100-80gb`` = ``h100-80gb:8x1``). A text that does not parse, an unknown
profile or a count below 1 is a :class:`ClusterError`, one line naming the valid profiles.

The simulator prices communication with the profile's own node size
(:attr:`DeviceProfile.gpus_per_node`, 8 for the DGX profiles); a cluster of another node size
still limits tensor parallelism to one node, and :attr:`Cluster.note` says that the
simulator's network model assumes the profile's nodes.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Optional

from slapo.errors import ConfigError

__all__ = ["Cluster", "ClusterError", "parse_cluster", "profile_names"]

_SPEC = re.compile(r"^(?P<profile>[A-Za-z0-9._-]+)(?::(?P<gpus>\d+)x(?P<nodes>\d+))?$")


class ClusterError(ConfigError):
    """A cluster spec that does not parse or names an unknown profile."""


def profile_names() -> list:
    """The device profiles a cluster may name (the simulator's table, then ``cpu``)."""
    from end2end.simulate.profiles import PROFILES

    return list(PROFILES) + ["cpu"]


@dataclass(frozen=True)
class Cluster:
    """``nodes`` nodes of ``gpus_per_node`` devices of the profile ``profile`` (its name)."""

    profile: str
    gpus_per_node: int
    nodes: int
    memory_bytes: float
    """One device's memory (the profile's capacity)."""
    peak_flops: dict
    """Peak FLOP/s of one device by torch dtype name (``float32``, ``bfloat16``, ...)."""
    profile_gpus_per_node: int
    """The node size the simulator's network model assumes (the profile's)."""
    allocator_overhead: float = 0.0
    """The simulator's allocator overhead on top of the peak (``sim-oom`` judges with it): the
    profile's, none with expandable segments (:mod:`end2end.simulate.cost.allocator`)."""
    reserved_bytes: float = 0.0
    """Memory the simulator reserves beyond the allocator (CUDA context, workspaces)."""
    nvlink_bytes_s: float = 0.0
    """One device's link inside a node, one way, times the profile's link efficiency."""
    network_bytes_s: float = 0.0
    """One node's network, one way, times the profile's link efficiency."""
    gemm_efficiency: dict = dataclasses.field(default_factory=dict)
    """The fraction of the peak a large GEMM reaches, by torch dtype name (the profile's
    :meth:`~end2end.simulate.cost.profiles.DeviceProfile.gemm_efficiency_of`; missing: 1)."""
    host_op_s: float = 0.0
    """Host seconds per eager op (the profile's; a phase takes at least its ops x this)."""
    calibration: str = ""
    overlap_slowdown: float = 0.0
    """How much longer compute takes beside an overlapped collective (the profile's)."""
    budget_bytes: float = 0.0
    """A per-rank memory budget below the device's memory (0: none): the driver's
    ``--mem-budget-gb`` (a run whose measured peak per rank, ``PerGPUMem``, exceeds it is an
    OOM), so a prediction whose ``PerGPUMem`` exceeds it is ``sim-oom`` (:meth:`with_budget`)."""

    @property
    def capacity_bytes(self) -> float:
        """What a rank may hold: the device's memory, or the budget when one is set and lower."""
        return min(self.memory_bytes, self.budget_bytes or self.memory_bytes)

    def with_budget(self, gb: Optional[float]) -> "Cluster":
        """This cluster with a per-rank memory budget of ``gb`` GB (``None``: unchanged)."""
        return self if gb is None else dataclasses.replace(self, budget_bytes=gb * 1e9)

    @property
    def gpus(self) -> int:
        """Devices in all (GPUS x NODES): the world size of every candidate."""
        return self.gpus_per_node * self.nodes

    @property
    def text(self) -> str:
        """The canonical spec, ``h100-80gb:8x4``."""
        return f"{self.profile}:{self.gpus_per_node}x{self.nodes}"

    @property
    def note(self) -> str:
        """What the prediction assumes beyond the spec ('' when nothing)."""
        if self.nodes > 1 and self.gpus_per_node != self.profile_gpus_per_node:
            return (f"the simulator prices the network for nodes of "
                    f"{self.profile_gpus_per_node} devices ({self.profile}), not "
                    f"{self.gpus_per_node}")
        return ""

    def default_dtype(self) -> str:
        """bf16 where the device runs it on tensor cores, fp16 on other GPUs, fp32 on cpu."""
        if self.profile == "cpu":
            return "fp32"
        half, bf16 = self.peak_flops.get("float16", 0), self.peak_flops.get("bfloat16", 0)
        return "bf16" if bf16 >= half else "fp16"


def parse_cluster(text: str, calibration: Optional[str] = None) -> Cluster:
    """The :class:`Cluster` of ``PROFILE:GPUSxNODES`` (module docstring); ``calibration``: the
    ``cpu`` profile's measurement file (default: the simulator's cache)."""
    from end2end.simulate.cost.allocator import fragmentation
    from end2end.simulate.profiles import get_profile

    names = profile_names()
    match = _SPEC.match(text.strip())
    if not match:
        raise ClusterError(f"cluster {text!r} does not parse", call="end2end.plan",
                           hint="write PROFILE:GPUSxNODES, e.g. h100-80gb:8x4; profiles: "
                                + ", ".join(names))
    name = match["profile"]
    if name not in names:
        raise ClusterError(f"cluster {text!r}: unknown device profile {name!r}",
                           call="end2end.plan", hint="use one of " + ", ".join(names))
    try:
        profile = get_profile(name, calibration or None)
    except ConfigError as exc:  # cpu without a calibration file
        raise ClusterError(f"cluster {text!r}: {exc.what}", call="end2end.plan",
                           hint=exc.hint) from None
    gpus = int(match["gpus"]) if match["gpus"] else profile.gpus_per_node
    nodes = int(match["nodes"]) if match["nodes"] else 1
    if gpus < 1 or nodes < 1:
        raise ClusterError(f"cluster {text!r}: {gpus} GPUs x {nodes} nodes",
                           call="end2end.plan", hint="both counts must be at least 1, e.g. "
                           f"{name}:8x4")
    return Cluster(name, gpus, nodes, float(profile.memory_bytes), dict(profile.flops),
                   profile.gpus_per_node, fragmentation(profile), profile.reserved_bytes,
                   profile.intra_node_bandwidth * profile.link_efficiency,
                   profile.inter_node_bandwidth * profile.network_efficiency,
                   {dtype: profile.gemm_efficiency_of(dtype) for dtype in profile.flops},
                   profile.host_op_s, calibration or "", profile.overlap_slowdown)
