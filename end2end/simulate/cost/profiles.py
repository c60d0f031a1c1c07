"""Device profiles: one table of the machines a config can be simulated for.

Every number of a GPU profile carries its source in :data:`SOURCES` (a datasheet, a published
benchmark table, PyTorch's or DeepSpeed's code); a number without a published measurement is
marked *assumed* there, and docs/simulate.md lists them all. Nothing here is fitted to a
published training run (the validation set judges the model, it never tunes it). The factors:

* ``gemm_efficiency``: the fraction of the dense peak the best-shaped large GEMM reaches (the
  measured "maximum achievable matmul FLOPS"); a GEMM of another shape loses more to tile and
  wave quantisation (:mod:`end2end.simulate.cost.gpu_model`, over ``sm_count`` SMs);
  ``fp32_gemm_efficiency`` the same for a dtype the tensor cores do not take (its peak is the
  fp32 one: fp32 everywhere, bf16 on a V100), where a measurement of its own exists (0: as
  ``gemm_efficiency``); :meth:`DeviceProfile.gemm_efficiency_of` picks one by dtype;
* ``attention_efficiency``: the fraction of the peak the fused attention kernels reach
  (``flash``, ``efficient``; the ``math`` path is GEMMs and elementwise ops, timed as such);
* ``memory_efficiency``: the fraction of the HBM bandwidth an elementwise kernel reaches;
  ``reduction_efficiency`` what PyTorch's row reductions (softmax, layer norm, ...) reach,
  ``forward`` and ``backward`` (empty: ``memory_efficiency``;
  :data:`end2end.simulate.cost.gpu_model.REDUCTION_KERNELS`);
* ``kernel_overhead_s``: the GPU's gap per kernel launch; ``host_op_s``: what eager PyTorch's
  Python, dispatcher and launch cost on the host per op (a phase takes at least its ops x
  this: the GPU waits for a host that issues kernels faster than they run);
* ``link_efficiency``: the fraction of NVLink's bandwidth a ring collective reaches,
  ``network_efficiency`` the fraction of a NIC's; with the latency ``alpha_s`` per ring step
  inside a node, ``inter_alpha_s`` per step that crosses nodes and ``collective_base_s`` per
  call (NCCL's own latency model);
* ``overlap_slowdown``: how much longer compute takes while an overlapped collective runs
  beside it (NCCL's kernels hold SMs and share HBM: compute that overlaps a collective
  progresses at ``1 / (1 + overlap_slowdown)`` of its rate; 0 on ``cpu``, where overlap has
  its own measured rule);
* ``allocator_overhead``: the caching allocator's fragmentation and reserve on top of the peak of
  live tensors (10 %, plus ``reserved_bytes`` for the CUDA context and workspaces);
* ``measured_overhead``, ``measured_fixed_bytes``: how the driver's memory measurement relates
  to the live tensors (0 and 0 on GPUs: ``torch.cuda.max_memory_allocated`` counts live
  tensors; on ``cpu`` the RSS high-water mark, calibrated by two real runs): the predicted
  ``PerGPUMem`` is ``measured_fixed_bytes + peak x (1 + measured_overhead)``, comparable with
  a measured row.

Memory capacities are binary: a "32 GB" V100 holds 32 GiB (2**35 bytes).

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
from typing import Any, Dict, Optional, Tuple

from slapo.errors import ConfigError

from end2end.simulate.cost.cpu_model import EagerCpuModel
from end2end.simulate.cost.load_verdict import describe_load

__all__ = ["DeviceProfile", "PROFILES", "SOURCES", "get_profile", "profile_from_file", "FORMAT",
           "FORMAT_CHANGES", "DEFAULT_CACHE", "GIB", "HOST_OP_ENV", "MEASURED_HOST_OP_S",
           "OVERLAP_SLOWDOWN"]

GB = 1e9
GIB = float(2 ** 30)


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """One device kind (see the module docstring); rates in FLOP/s and bytes/s."""

    name: str
    description: str
    memory_bytes: float
    flops: Dict[str, float]  # peak dense FLOP/s per dtype name (float32, float16, bfloat16)
    memory_bandwidth: float
    intra_node_bandwidth: float  # per GPU, one direction (NVLink)
    inter_node_bandwidth: float  # per node, one direction (all its NICs together)
    gpus_per_node: int = 8
    gemm_efficiency: float = 0.7
    fp32_gemm_efficiency: float = 0.0  # 0: as gemm_efficiency
    memory_efficiency: float = 0.8
    kernel_overhead_s: float = 5e-6
    link_efficiency: float = 0.8
    network_efficiency: float = 0.8
    alpha_s: float = 10e-6
    inter_alpha_s: float = 30e-6
    allocator_overhead: float = 0.10
    reserved_bytes: float = 1.0 * GB
    measured_overhead: float = 0.0
    measured_fixed_bytes: float = 0.0
    eager: Optional[EagerCpuModel] = None  # ``cpu``: the eager-PyTorch time model
    sm_count: int = 0  # streaming multiprocessors (0: no tile/wave model)
    compute_capability: Tuple[int, int] = (0, 0)  # CUDA sm_XY ((0, 0): not a CUDA device)
    attention_efficiency: Dict[str, float] = dataclasses.field(default_factory=dict)
    reduction_efficiency: Dict[str, float] = dataclasses.field(default_factory=dict)
    host_op_s: float = 0.0
    collective_base_s: float = 0.0  # fixed latency per collective call (NCCL's baseLat)
    calibration: Dict[str, Any] = dataclasses.field(default_factory=dict)  # ``cpu``: its file
    host_note: str = ""  # a GPU profile's host cost replaced (:data:`HOST_OP_ENV`)
    overlap_slowdown: float = 0.0  # compute beside an overlapped collective: 1 + this longer

    @property
    def provenance(self) -> str:
        """Which calibration a prediction used: the ``cpu`` file, when it was measured and under
        what load; a GPU profile's datasheet numbers."""
        if not self.calibration:
            return (f"{self.name}: datasheet profile (end2end/simulate/cost/profiles.py "
                    f"SOURCES){self.host_note}")
        c = self.calibration
        return f"cpu calibration {c['path']} measured {c['measured']}, {describe_load(c['load'])}"

    def rate(self, dtype: str) -> float:
        """Peak FLOP/s of ``dtype`` (float32 for dtypes without a table entry)."""
        return self.flops.get(dtype, self.flops["float32"])

    def gemm_efficiency_of(self, dtype: str) -> float:
        """The large-GEMM efficiency of ``dtype``: ``fp32_gemm_efficiency`` where the dtype runs
        at the fp32 peak (CUDA cores) and the profile has one, else ``gemm_efficiency``."""
        if self.fp32_gemm_efficiency and self.rate(dtype) == self.flops["float32"]:
            return self.fp32_gemm_efficiency
        return self.gemm_efficiency

    @property
    def label(self) -> str:
        """The Device column of a simulated row."""
        return f"{self.name} (simulated)"


# -- the sources of every GPU number (docs/simulate.md, "Device profiles", lists them) --------
_V100 = "NVIDIA V100 datasheet (SXM2: 15.7 TFLOP/s fp32, 125 tensor, 900 GB/s HBM2, 80 SMs, " \
    "NVLink 300 GB/s bidirectional = 6 links x 25 GB/s per direction)"
_A100 = "NVIDIA A100 datasheet (SXM4: 19.5 TFLOP/s fp32, 312 fp16/bf16 tensor dense, HBM2 " \
    "1555 GB/s (40 GB) / HBM2e 2039 GB/s (80 GB), 108 SMs, NVLink 3 600 GB/s bidirectional)"
_H100 = "NVIDIA H100 datasheet (SXM5: 67 TFLOP/s fp32, 989 bf16/fp16 tensor dense (1979 with " \
    "sparsity), HBM3 3.35 TB/s, 132 SMs, NVLink 4 900 GB/s bidirectional)"
_H200 = "NVIDIA H200 datasheet (SXM: H100's compute, 141 GB HBM3e at 4.8 TB/s); nvidia-smi " \
    "reports 143771 MiB"
_TITAN = "pytorch/torchtitan docs/performance.md (Meta's Grand Teton platform: 8 H100 per " \
    "host fully connected with NVLink, each with 96 GB HBM2e at 2.4 TB/s, 400 Gb/s RDMA per " \
    "GPU, run at the default 500 W power limit)"
_MAMF = "stas00/ml-engineering compute/accelerator/README.md, 'Maximum Achievable Matmul FLOPS " \
    "comparison table' (BF16, mamf-finder.py, best shape)"
_SDPA = "PyTorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (can_use_flash_attention, " \
    "can_use_mem_efficient_attention; end2end/simulate/cost/kernels.py)"
_FA2 = "Dao 2023, FlashAttention-2 (arXiv 2307.08691), abstract/introduction: FlashAttention-2 " \
    "reaches 50-73 % of the A100's peak, FlashAttention (the memory-efficient kind) 25-40 %; " \
    "midpoints taken"
_FA2_H100 = "Shah et al. 2024, FlashAttention-3 (arXiv 2407.08608), abstract: FlashAttention-2 " \
    "(PyTorch's flash SDPA kernel) reaches only 35 % utilization on the H100; efficient: " \
    "A100's efficient/flash ratio (0.33 / 0.6, " + _FA2 + ") applied to it, " \
    "0.35 x 0.55 = 0.19, assumed (no published H100 measurement of it found)"
_MARKIDIS = "Markidis et al. 2018, NVIDIA Tensor Core Programmability, Performance & " \
    "Precision (IPDPSW 2018, doi:10.1109/IPDPSW.2018.00091), abstract: " \
    "cuBLAS GEMM on a Tesla V100's Tensor Cores reaches up to 83 TFLOP/s in mixed precision, " \
    "'seven times' the single-precision performance"
_V100_GEMM = _MARKIDIS + ": 83 of 125 TFLOP/s = 66.4 % (fp16 on Tensor Cores)"
_V100_SGEMM = _MARKIDIS + ": 83 / 7 = 11.9 of 15.7 TFLOP/s = 75.5 % (fp32, and bf16, which " \
    "a V100 runs at the fp32 rate; 'seven times' is the paper's rounding)"
_NCCL = "NVIDIA/nccl src/graph/tuning.cc of a NCCL 2.x release (latencies of its Ring/Simple " \
    "protocol: baseLat 8.4 us per call, hwLat 5.7 us per step on NVLink, 6.6 us on the network)"
_OVERLAP = "Lee et al. 2025, Characterizing Compute-Communication Overlap in GPU-Accelerated " \
    "Distributed Deep Learning (arXiv 2507.03114), abstract: overlapping computation and " \
    "communication slows the computation by 18.9 % on average (at most 40.0 %) against the " \
    "same computation without communication beside it, over GPT and LLaMA training on 4 " \
    "A100s, H100s, MI250s and MI210s; the average taken for every NVIDIA profile (V100: " \
    "assumed the same)"
_ASSUMED = "assumed (no published measurement found); judged by the validation set, never fitted"
_FOUND = " (the measurements found, quoted: docs/results/validation/gpu_constant_sources.md)"
# -- measured sources of the efficiencies (docs/results/validation/gpu_constant_sources.md) ----
_TRIAD = "BabelStream Triad (STREAM-like, the figure of merit of a streaming kernel) / the " \
    "datasheet's HBM bandwidth: "
_MEM = {
    "v100": _TRIAD + "846.5 of 900 GB/s = 0.941 on a Tesla V100-PCIE-16GB (Isambard; " \
    "kaanolgu/BabelStream docs/instructions.md; the PCIe card has the SXM2's HBM2 peak; CSCS " \
    "ReFrame's device-to-device copy reference on a V100, reframe-hpc/reframe cscs-checks/" \
    "microbenchmarks/gpu/memory_bandwidth/memory_bandwidth.py: 777.8 GiB/s = 0.928)",
    "a100-40gb": _TRIAD + "1377.4 of 1555 GB/s = 0.886 on an A100-SXM4-40GB (ALCF Polaris; " \
    "argonne-lcf/ALCFBeginnersGuide polaris/02_profiling.md)",
    "a100-80gb": _TRIAD + "1724.8 (Tursa, ukri-bench/benchmark-BabelStream README.md) and " \
    "1700 (Azure ND A100 v4, Azure/AI-benchmarking-guide Azure_Results/ND_A100_v4_results.md) " \
    "of 2039 GB/s on A100-SXM4-80GB: 0.846 and 0.834, mean 0.840",
    "h100": _TRIAD + "2.97 of 3.35 TB/s = 0.887 on H100 80GB HBM3 SXM (Azure ND H100 v5, " \
    "Azure/AI-benchmarking-guide 'Azure Results/ND_H100_v5_results.md')",
    "h200": _TRIAD + "4.15 of 4.8 TB/s = 0.865 on H200 141GB (Azure ND H200 v5, " \
    "Azure/AI-benchmarking-guide Azure_Results/ND_H200_v5_results.md)",
}
_LIGER = "linkedin/Liger-Kernel benchmark/data/{csv} (its 'huggingface' provider: torch.nn." \
    "LayerNorm, ATen's native_layer_norm; fp32, 4096 rows of 1024 to 16384): on an {gpu}, the " \
    "median of the five row lengths moves the forward's 2 x rows x cols x 4 B at {fwd} GB/s " \
    "of the {peak} GB/s datasheet peak = {f}, the backward's 3 x rows x cols x 4 B (the " \
    "'full' time minus the forward's) at {bwd} GB/s = {b}; that card's fraction, taken for " \
    "this one{note} (published softmax forwards lie in the same range: docs/results/" \
    "validation/kernel_bandwidth_sources.md)"
_REDUCTION = {
    "ampere": _LIGER.format(csv="a100_all_benchmark_data.csv @bdbfeadf", gpu="A100 80GB PCIe",
                            fwd="1057", bwd="700", peak="1935", f="0.546", b="0.362", note=""),
    "hopper": _LIGER.format(csv="h100_all_benchmark_data.csv @3534d446", gpu="H100 NVL",
                            fwd="1819", bwd="1285", peak="3938", f="0.462", b="0.326",
                            note=" (HBM2e H100 and H200: the HBM3 H100's, assumed)"),
    "volta": "pytorch/pytorch#67977 (ATen's current layer-norm forward kernel): 'for a typical " \
    "transformer size (32*196, 1024) time goes down from ~180us to ~49 us on Volta', fp16 (in " \
    "fp32 the bytes would exceed the peak): 2 x 6272 x 1024 x 2 B / 49 us = 524 of 900 GB/s = " \
    "0.582 forward; backward: no V100 measurement of the current kernel found (the 2019-2021 " \
    "kernels: 13-27 % in pytorch/pytorch#27634 and #64801), the forward's fraction x the A100's " \
    "measured backward / forward (700 / 1057, " + _LIGER.format(
        csv="a100_all_benchmark_data.csv @bdbfeadf", gpu="A100 80GB PCIe", fwd="1057",
        bwd="700", peak="1935", f="0.546", b="0.362", note="") + ") = 0.385, assumed",
}
_KERNEL = "CSCS ReFrame's null-kernel latency reference (reframe-hpc/reframe cscs-checks/" \
    "microbenchmarks/gpu/kernel_latency/kernel_latency.py, 5000 back-to-back empty kernels, " \
    "one synchronize): "
_HOST = "measured: docs/results/gpu_h200/host_cost.txt (python -m end2end.simulate.host_cost " \
    "on the 5 small host-bound models of docs/results/gpu_h200/more, one H200 whose host is a " \
    "16-core Sapphire Rapids-class Xeon VM, torch 2.11: median 54.1 us per recorded op, " \
    "26.4-66.7, the recorded step less the optimizer's first-step state creation); the DGX " \
    "H100/H200 hosts are Xeon 8480C of that generation (NVIDIA's DGX datasheets); the older " \
    "hosts of the A100 and V100 profiles are assumed the same (no " \
    "measurement of theirs found; judged by the validation set, never fitted). " \
    "Published for comparison: facebookresearch/HolisticTraceAnalysis docs/source/features/" \
    "cuda_kernel_launch_stats.rst, 'the launch time on the CPU side is between 5-20 " \
    "microseconds' (the launch alone, without Python modules and autograd)"
_NVLINK = "nccl-tests all_reduce busbw of a ring / NVLink's per-GPU one-direction rate: "
_NDR = "NVIDIA/nccl-tests#290 (NVIDIA's comment): 'For NDR @ 400Gbps you should see 46-48GB/s " \
    "per NIC', 47 of 50 GB/s = 0.94"
_RESERVED = "pytorch/pytorch#109888 and #107667 (ptrblck): the CUDA context takes about 300-400 " \
    "MB with lazy module loading (CUDA >= 11.7), over 1000 MB before; cuBLAS and cuBLASLt " \
    "workspaces 8-40 MiB per handle and stream (PyTorch PR #120925); NCCL's buffers are in no " \
    "source found, so 1 GB is kept, " + _ASSUMED

_A100_COMMON = dict(
    kernel_overhead_s=_KERNEL + "2.7 us on an A100", link_efficiency=_NVLINK + "234.89 of 300 "
    "GB/s = 0.783 (stas00/ml-engineering network/README.md, one A100 node, 16 GiB) and 231.58 "
    "(Azure/AI-benchmarking-guide ND_A100_v4_results.md, 8G) = 0.772: 0.78",
    network_efficiency=_NDR + " (HDR InfiniBand: NDR's fraction, assumed)",
    reduction_efficiency=_REDUCTION["ampere"], reserved_bytes=_RESERVED)
_HOPPER_COMMON = dict(
    kernel_overhead_s="as a100 (" + _KERNEL + "2.7 us on an A100; none found for Hopper, "
    "assumed the same)", link_efficiency=_NVLINK + "NVIDIA/nccl-tests#212 (the NCCL "
    "maintainer): 'NCCL can get an effective NVLink bandwidth of 370GB/s' of 450 with "
    "NCCL_ALGO=RING = 0.822; NVIDIA/nccl#1455: 365-370 GB/s on 8 x H100; stas00 8 x H200 ring "
    "367.61 GB/s: 0.82 (the NVLS in-switch all-reduce, NCCL's default on Hopper, is not "
    "modelled)", network_efficiency=_NDR, reduction_efficiency=_REDUCTION["hopper"],
    reserved_bytes=_RESERVED)

SOURCES: Dict[str, Dict[str, str]] = {
    "v100-32gb": dict(
        device=_V100 + "; AWS p3dn.24xlarge: 8 x V100-SXM2 32 GB, 100 Gb/s EFA per node",
        gemm_efficiency=_V100_GEMM, fp32_gemm_efficiency=_V100_SGEMM,
        attention_efficiency="efficient: " + _FA2 + "; flash: not eligible on sm70 (" + _SDPA
        + ")", memory_efficiency=_MEM["v100"], kernel_overhead_s=_KERNEL + "1.83 us on a V100",
        reduction_efficiency=_REDUCTION["volta"],
        link_efficiency="NVIDIA/nccl src/graph/topo.h: SM70_NVLINK_BW 20.0 GB/s per 25 GB/s "
        "link = 0.80 (NCCL's own model; no nccl-tests result for 8 x V100-SXM2 found)",
        network_efficiency="stas00/ml-engineering network/README.md: 'EFA v1 0.4 Tbps "
        "(effective 340 Gbps for all_reduce tests)' = 0.85 (p3dn's EFA is that generation)",
        reserved_bytes="pytorch/pytorch#28394: 1008 MB used on a Volta GPU after one small "
        "tensor (PyTorch 1.3, CUDA < 11.7: every kernel loaded into the context)",
        alpha_s=_ASSUMED),
    "v100-32gb-dgx2": dict(
        device=_V100 + "; NVIDIA DGX-2 datasheet: 16 x V100 32 GB on NVSwitch (each GPU its "
        "6 NVLinks, 150 GB/s per direction), 8 x 100 Gb/s InfiniBand EDR per node",
        gemm_efficiency="as v100-32gb", fp32_gemm_efficiency="as v100-32gb",
        attention_efficiency="as v100-32gb", memory_efficiency="as v100-32gb",
        reduction_efficiency="as v100-32gb", kernel_overhead_s="as v100-32gb",
        link_efficiency="as v100-32gb",
        reserved_bytes="as v100-32gb", network_efficiency=_NDR + " (EDR InfiniBand: NDR's "
        "fraction, assumed)"),
    "a100-40gb": dict(
        device=_A100 + "; NVIDIA DGX A100 datasheet: 8 GPUs on NVSwitch, 8 x 200 Gb/s HDR "
        "InfiniBand (ConnectX-6) for the compute network", gemm_efficiency=_MAMF
        + ": A100 SXM 271.2 of 312 TFLOP/s = 86.9 %", attention_efficiency=_FA2,
        memory_efficiency=_MEM["a100-40gb"], **_A100_COMMON),
    "a100-80gb": dict(device=_A100 + "; DGX A100 (as a100-40gb)", gemm_efficiency=_MAMF
                      + ": A100 SXM 86.9 %", attention_efficiency=_FA2,
                      memory_efficiency=_MEM["a100-80gb"], **_A100_COMMON),
    "h100-80gb": dict(
        device=_H100 + "; NVIDIA DGX H100 datasheet: 8 GPUs on NVSwitch, 8 x 400 Gb/s "
        "(ConnectX-7) for the compute network", gemm_efficiency=_MAMF
        + ": H100 SXM 794.5 of 989 TFLOP/s = 80.3 %", attention_efficiency=_FA2_H100,
        memory_efficiency=_MEM["h100"], **_HOPPER_COMMON),
    "h100-96gb": dict(
        device=_H100 + " for compute, SMs and NVLink; " + _TITAN,
        gemm_efficiency="as h100-80gb", attention_efficiency="as h100-80gb",
        memory_efficiency="as h100-80gb (HBM3); for this card's HBM2e no measurement found: "
        + _ASSUMED, **_HOPPER_COMMON,
        power_limit=_ASSUMED + ": the datasheet's peaks are at 700 W; the 500 W limit's clocks "
        "are not published, so compute-bound phases are predicted fast"),
    "h200": dict(device=_H200 + "; DGX H200: the DGX H100 network", gemm_efficiency=_MAMF
                 + ": GH200 (H200-class GPU, 141 GB HBM3e) 828.6 of 989 = 83.8 %",
                 attention_efficiency="as h100-80gb", memory_efficiency=_MEM["h200"],
                 **_HOPPER_COMMON),
}
for _name in SOURCES:
    for _key in ("alpha_s", "inter_alpha_s", "collective_base_s"):
        SOURCES[_name].setdefault(_key, _NCCL)
    SOURCES[_name].setdefault("host_op_s", _HOST)
    SOURCES[_name].setdefault("overlap_slowdown", _OVERLAP)
    SOURCES[_name].setdefault("allocator_overhead", _ASSUMED + _FOUND + ": GMLake (ASPLOS'24) "
                              "measured PyTorch's allocator at 15-33 % fragmentation on "
                              "recomputation, offloading, ZeRO-3 and LoRA workloads; no figure "
                              "for plain training")
    SOURCES[_name].setdefault("attention kernel choice", _SDPA)

_HALF = ("float16", "bfloat16")
#: (flash, efficient) attention efficiency on sm90: FlashAttention-2 at 35 % of the H100's peak
#: (:data:`SOURCES`), the efficient kernel at A100's ratio to it
HOPPER_ATTENTION = (0.35, 0.19)
#: (Tensor Core, fp32) large-GEMM efficiency of a V100: Markidis et al. 2018 (:data:`SOURCES`)
V100_GEMM = (83 / 125, 83 / 7 / 15.7)
#: The measured efficiencies of :data:`SOURCES` (docs/results/validation/gpu_constant_sources.md):
#: streaming memory (BabelStream Triad / datasheet), the GPU's gap per kernel (CSCS null-kernel
#: latency), NVLink (nccl-tests ring busbw / link) and a NIC (NVIDIA's NDR figure; EFA v1)
V100_MEASURED = dict(memory_efficiency=846.5 / 900, kernel_overhead_s=1.83e-6,
                     link_efficiency=20.0 / 25, network_efficiency=340 / 400,
                     reduction_efficiency=dict(forward=524 / 900,
                                               backward=524 / 900 * 700 / 1057))
#: and PyTorch's row reductions (Liger-Kernel's LayerNorm medians / the card's datasheet peak)
AMPERE_MEASURED = dict(kernel_overhead_s=2.7e-6, link_efficiency=0.78,
                       network_efficiency=47 / 50,
                       reduction_efficiency=dict(forward=1057 / 1935, backward=700 / 1935))
#: the host's time per issued op (Python, dispatch, autograd, launch), measured on one H200
#: machine (:data:`SOURCES`, docs/results/gpu_h200/host_cost.txt)
MEASURED_HOST_OP_S = 54.1e-6
#: compute beside an overlapped collective takes this much longer: the average of Lee et al.
#: 2025 (:data:`SOURCES`, ``overlap_slowdown``)
OVERLAP_SLOWDOWN = 0.189
HOPPER_MEASURED = dict(kernel_overhead_s=2.7e-6, link_efficiency=0.82,
                       network_efficiency=47 / 50,
                       reduction_efficiency=dict(forward=1819 / 3938, backward=1285 / 3938))


def _gpu(name, description, memory_gib, peak, bandwidth, sms, cc, gemm,
         attention=(0.6, 0.33), bf16=True, **kw) -> DeviceProfile:
    """A GPU profile; ``peak``: (fp32, fp16 tensor-core) FLOP/s; ``bandwidth``: (HBM, NVLink
    per GPU, network per node) bytes/s; ``attention``: (flash, efficient) fractions of the peak
    (:data:`SOURCES`); ``bf16``: tensor cores take bf16 (sm80+; V100 runs bf16 at the fp32
    rate)."""
    (fp32, half), (hbm, nvlink, network) = peak, bandwidth
    flops = {"float32": fp32, "float16": half, "bfloat16": half if bf16 else fp32}
    return DeviceProfile(name, description, memory_gib * GIB, flops, hbm, nvlink, network,
                         gemm_efficiency=gemm, sm_count=sms, compute_capability=cc,
                         attention_efficiency=dict(flash=attention[0], efficient=attention[1]),
                         host_op_s=MEASURED_HOST_OP_S, alpha_s=5.7e-6, inter_alpha_s=6.6e-6,
                         collective_base_s=8.4e-6, overlap_slowdown=OVERLAP_SLOWDOWN, **kw)


PROFILES: Dict[str, DeviceProfile] = {p.name: p for p in (
    _gpu("v100-32gb", "p3dn.24xlarge: 8 x V100-SXM2 32 GB, NVLink, 100 Gb/s", 32, (15.7e12,
         125e12), (900e9, 150e9, 12.5e9), 80, (7, 0), V100_GEMM[0], bf16=False,
         fp32_gemm_efficiency=V100_GEMM[1], **V100_MEASURED),
    _gpu("v100-32gb-dgx2", "DGX-2: 16 x V100-SXM3 32 GB, NVSwitch, 8 x 100 Gb/s IB", 32,
         (15.7e12, 125e12), (900e9, 150e9, 100e9), 80, (7, 0), V100_GEMM[0], bf16=False,
         fp32_gemm_efficiency=V100_GEMM[1], gpus_per_node=16,
         **{**V100_MEASURED, "network_efficiency": 47 / 50}),
    _gpu("a100-40gb", "DGX A100: 8 x A100-SXM4 40 GB, NVSwitch, 8 x 200 Gb/s IB", 40,
         (19.5e12, 312e12), (1555e9, 300e9, 200e9), 108, (8, 0), 0.869,
         memory_efficiency=1377.4 / 1555, **AMPERE_MEASURED),
    _gpu("a100-80gb", "DGX A100: 8 x A100-SXM4 80 GB, NVSwitch, 8 x 200 Gb/s IB", 80,
         (19.5e12, 312e12), (2039e9, 300e9, 200e9), 108, (8, 0), 0.869,
         memory_efficiency=0.840, **AMPERE_MEASURED),
    _gpu("h100-80gb", "DGX H100: 8 x H100-SXM5 80 GB, NVSwitch, 8 x 400 Gb/s", 80,
         (67e12, 989e12), (3350e9, 450e9, 400e9), 132, (9, 0), 0.803, HOPPER_ATTENTION,
         memory_efficiency=2.97 / 3.35, **HOPPER_MEASURED),
    _gpu("h100-96gb", "Grand Teton: 8 x H100 96 GB HBM2e (2.4 TB/s, 500 W), NVLink, "
         "8 x 400 Gb/s RDMA", 96, (67e12, 989e12), (2400e9, 450e9, 400e9), 132, (9, 0), 0.803,
         HOPPER_ATTENTION, memory_efficiency=2.97 / 3.35, **HOPPER_MEASURED),
    _gpu("h200", "DGX H200: 8 x H200-SXM 141 GB, NVSwitch, 8 x 400 Gb/s", 143771 / 1024,
         (67e12, 989e12), (4800e9, 450e9, 400e9), 132, (9, 0), 0.838, HOPPER_ATTENTION,
         memory_efficiency=4.15 / 4.8, **HOPPER_MEASURED),
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
        profile = PROFILES[name]
    except KeyError:
        raise ConfigError(f"unknown device profile {name!r}", call="end2end.simulate",
                          hint=f"use one of {', '.join(list(PROFILES) + ['cpu'])}") from None
    return _with_host_cost(profile, os.environ.get(HOST_OP_ENV, ""))


#: Environment variable: microseconds of host time per issued op for every GPU profile, in
#: place of the profiles' ``host_op_s`` (another host's own measurement: ``python -m
#: end2end.simulate.host_cost``); read in every simulating process, so subprocesses follow it
HOST_OP_ENV = "SLAPO_SIM_HOST_OP_US"


def _with_host_cost(profile: DeviceProfile, text: str) -> DeviceProfile:
    if not text:
        return profile
    try:
        micro = float(text)
    except ValueError:
        micro = float("nan")
    if not micro > 0 or micro == float("inf"):
        raise ConfigError(f"{HOST_OP_ENV}={text!r}: not a positive number of microseconds",
                          call="end2end.simulate",
                          hint=f"e.g. {HOST_OP_ENV}=54.1 (python -m end2end.simulate.host_cost "
                               "measures it), or unset it for the profiles' own value")
    return dataclasses.replace(profile, host_op_s=micro * 1e-6,
                               host_note=f"; host {micro:g} us per op ({HOST_OP_ENV})")


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
    calibration = dict(path=str(path), measured=data["measured"], load=data.get("load"))
    return dataclasses.replace(
        DeviceProfile("cpu", f"this machine, measured {data['measured']} ({path}; "
                      f"{describe_load(data.get('load'))})",
                      float(psutil.virtual_memory().total), data["flops"],
                      data["memory_bandwidth"], data["bandwidth"], data["bandwidth"],
                      gpus_per_node=64),
        gemm_efficiency=1.0, memory_efficiency=0.8, kernel_overhead_s=2e-6,
        link_efficiency=1.0, network_efficiency=1.0, alpha_s=data["alpha_s"],
        inter_alpha_s=data["alpha_s"],
        allocator_overhead=0.0, reserved_bytes=0.0,
        measured_overhead=data.get("memory_overhead", 0.0),
        measured_fixed_bytes=data.get("memory_fixed_bytes", 0.0), eager=eager,
        calibration=calibration)
