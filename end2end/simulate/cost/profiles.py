"""Device profiles: one table of the machines a config can be simulated for.

Every number is a vendor datasheet figure (peak dense GEMM rate per dtype, HBM bandwidth,
NVLink and network bandwidth) and the efficiency factors are stated here once, for all configs
and models alike (never tuned per config or figure):

* ``gemm_efficiency``: the fraction of the peak a large GEMM reaches (0.7 on V100/A100, 0.6 on
  H100/H200, whose peaks are harder to reach), the same for every op that does FLOPs;
* ``memory_efficiency``: the fraction of the HBM bandwidth an elementwise kernel reaches (0.8);
* ``kernel_overhead_s``: the fixed cost of one kernel launch (5 us on GPUs);
* ``link_efficiency``: the fraction of a link's bandwidth a ring collective reaches (0.8), with
  the latency ``alpha_s`` per step;
* ``allocator_overhead``: the caching allocator's fragmentation and reserve on top of the peak of
  live tensors (10 %, plus ``reserved_bytes`` for the CUDA context and workspaces);
* ``measured_overhead``, ``measured_fixed_bytes``: how the driver's memory measurement relates
  to the live tensors (0 and 0 on GPUs: ``torch.cuda.max_memory_allocated`` counts live
  tensors; on ``cpu`` the RSS high-water mark, calibrated by two real runs): the predicted
  ``PerGPUMem`` is ``measured_fixed_bytes + peak x (1 + measured_overhead)``, comparable with
  a measured row.

``cpu`` is this machine, measured (:mod:`end2end.simulate.calibration.cpu`) and cached
(the file: :func:`profile_from_file`, :data:`FORMAT`). Its ops are
not timed by the roofline above but by the eager-PyTorch model in ``eager``
(:class:`~end2end.simulate.cost.cpu_model.EagerCpuModel`: per-op dispatch and autograd cost, GEMM
rate by size, threads per rank); GPU profiles have none.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Dict, Optional

from slapo.errors import ConfigError

from end2end.simulate.cost.cpu_model import EagerCpuModel

__all__ = ["DeviceProfile", "PROFILES", "get_profile", "profile_from_file", "FORMAT",
           "FORMAT_CHANGES", "DEFAULT_CACHE"]

GB = 1e9


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """One device kind (see the module docstring); rates in FLOP/s and bytes/s."""

    name: str
    description: str
    memory_bytes: float
    flops: Dict[str, float]  # peak dense FLOP/s per dtype name (float32, float16, bfloat16)
    memory_bandwidth: float
    intra_node_bandwidth: float  # per GPU, one direction (NVLink)
    inter_node_bandwidth: float  # per node, one direction (network)
    gpus_per_node: int = 8
    gemm_efficiency: float = 0.7
    memory_efficiency: float = 0.8
    kernel_overhead_s: float = 5e-6
    link_efficiency: float = 0.8
    alpha_s: float = 10e-6
    inter_alpha_s: float = 30e-6
    allocator_overhead: float = 0.10
    reserved_bytes: float = 1.0 * GB
    measured_overhead: float = 0.0
    measured_fixed_bytes: float = 0.0
    eager: Optional[EagerCpuModel] = None  # ``cpu``: the eager-PyTorch time model

    def rate(self, dtype: str) -> float:
        """Peak FLOP/s of ``dtype`` (float32 for dtypes without a table entry)."""
        return self.flops.get(dtype, self.flops["float32"])

    @property
    def label(self) -> str:
        """The Device column of a simulated row."""
        return f"{self.name} (simulated)"


def _gpu(name, description, memory_gb, fp32, half, hbm, nvlink, network, **kw) -> DeviceProfile:
    return DeviceProfile(name, description, memory_gb * GB,
                         {"float32": fp32, "float16": half, "bfloat16": half}, hbm, nvlink,
                         network, **kw)


PROFILES: Dict[str, DeviceProfile] = {p.name: p for p in (
    # p3dn.24xlarge: 8 x V100 32 GB SXM2, NVLink (~150 GB/s per GPU one way on the hybrid cube
    # mesh's ring), 100 Gb/s EFA between nodes; V100 has no bf16 (bf16 runs at the fp32 rate)
    DeviceProfile("v100-32gb", "p3dn.24xlarge: 8 x V100-SXM2 32 GB, NVLink, 100 Gb/s",
                  32 * GB, {"float32": 15.7e12, "float16": 125e12, "bfloat16": 15.7e12},
                  900e9, 150e9, 12.5e9),
    _gpu("a100-80gb", "8 x A100-SXM4 80 GB, NVLink 3, 4 x 200 Gb/s", 80, 19.5e12, 312e12,
         2039e9, 300e9, 100e9),
    _gpu("h100-80gb", "8 x H100-SXM5 80 GB, NVLink 4, 8 x 400 Gb/s", 80, 67e12, 989e12,
         3350e9, 450e9, 400e9, gemm_efficiency=0.6),
    _gpu("h200", "8 x H200-SXM 141 GB, NVLink 4, 8 x 400 Gb/s", 141, 67e12, 989e12, 4800e9,
         450e9, 400e9, gemm_efficiency=0.6),
)}


def get_profile(name: str, calibration: Optional[str] = None) -> DeviceProfile:
    """The profile called ``name``; ``cpu`` read from its calibration file (``calibration``,
    default :data:`DEFAULT_CACHE`), which must exist
    (measuring it: :func:`end2end.simulate.calibration.cpu.device_profile`)."""
    if name == "cpu":
        path = Path(calibration) if calibration else DEFAULT_CACHE
        if not path.exists():
            raise ConfigError(f"no cpu calibration at {path}", call="end2end.simulate",
                              hint=f"measure it: python -m end2end.simulate.calibrate --out "
                                   f"{path} (or pass the committed docs/results/"
                                   "cpu_profile.json)")
        return profile_from_file(path)
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown device profile {name!r}", call="end2end.simulate",
                          hint=f"use one of {', '.join(list(PROFILES) + ['cpu'])}") from None


#: the calibration file's format; a file of another format is refused with the command to
#: re-measure it (what each format added: :data:`FORMAT_CHANGES`)
FORMAT = 3
FORMAT_CHANGES = {1: "the eager-PyTorch model",
                  2: "DeepSpeed ZeRO-3's seconds per hooked module, parameter and byte",
                  3: "the RSS's fixed part, from two reference runs"}

DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / \
    "slapo" / "cpu_profile.json"


def profile_from_file(path: Path):
    """The ``cpu`` profile of a calibration file written by
    :func:`end2end.simulate.calibration.cpu.cpu_profile`."""
    import psutil

    hint = f"re-measure it: python -m end2end.simulate.calibrate --out {path}"
    try:
        data = json.loads(Path(path).read_text())
        eager = EagerCpuModel.from_json(data["eager"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        what = ("has no eager-PyTorch measurements (an older calibration)"
                if isinstance(exc, KeyError) else f"cannot be read ({type(exc).__name__}: {exc})")
        raise ConfigError(f"the cpu calibration {path} {what}",
                          call="end2end.simulate --device cpu", hint=hint) from None
    if data.get("format", 1) != FORMAT:
        raise ConfigError(f"the cpu calibration {path} has format {data.get('format', 1)}, this "
                          f"simulator reads format {FORMAT} (it measures more: "
                          f"{FORMAT_CHANGES[FORMAT]})", call="end2end.simulate --device cpu",
                          hint=hint)
    return dataclasses.replace(
        DeviceProfile("cpu", f"this machine, measured {data['measured']} ({path})",
                      float(psutil.virtual_memory().total), data["flops"],
                      data["memory_bandwidth"], data["bandwidth"], data["bandwidth"],
                      gpus_per_node=64),
        gemm_efficiency=1.0, memory_efficiency=0.8, kernel_overhead_s=2e-6,
        link_efficiency=1.0, alpha_s=data["alpha_s"], inter_alpha_s=data["alpha_s"],
        allocator_overhead=0.0, reserved_bytes=0.0,
        measured_overhead=data.get("memory_overhead", 0.0),
        measured_fixed_bytes=data.get("memory_fixed_bytes", 0.0), eager=eager)
