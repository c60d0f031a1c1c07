"""The GPU side of the time model (issue 35): the network per collective (how many of a group's
ranks share each node's NICs), capacities in GiB, GEMM efficiency by shape (tile and wave
quantisation), fused attention's efficiency, the host's issue rate, and that every GPU
profile's constants carry a source."""

from __future__ import annotations

import dataclasses
import math

import pytest

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from end2end.simulate.cost.gpu_model import (REDUCTION_KERNELS, kernel_seconds, phase_seconds,
                                             tile_utilisation)
from end2end.simulate.cost.profiles import GIB, PROFILES, SOURCES
from end2end.simulate.cost.records import CollectiveRecord, OpRecord
from end2end.simulate.cost.timing import (collective_seconds, rank_seconds, ring_bandwidth,
                                          ring_rate)
from end2end.simulate.engine.recorder import StepRecorder

V100 = PROFILES["v100-32gb"]


def _gather(ranks, nbytes=10 ** 10, kind="allgather"):
    return CollectiveRecord(kind, nbytes, len(ranks), tuple(ranks), "forward")


def _beta(c: CollectiveRecord, profile) -> float:
    """The bandwidth term of a collective's seconds (its latency taken off)."""
    return collective_seconds(c, profile) - collective_seconds(
        dataclasses.replace(c, bytes=0), profile)


def test_latency_follows_nccls_ring_model():
    """A ring's latency: NCCL's base per call, the network's per step for the steps that cross
    nodes (nodes - 1 per pass), NVLink's for the others."""
    inside = collective_seconds(_gather(range(8), 0), V100)
    assert inside == pytest.approx(V100.collective_base_s + 7 * V100.alpha_s)
    across = collective_seconds(_gather(range(64), 0, kind="allreduce"), V100)
    assert across == pytest.approx(V100.collective_base_s + 2 * 7 * V100.inter_alpha_s
                                   + 2 * 56 * V100.alpha_s)


@pytest.mark.parametrize("n", [16, 32, 64])
def test_zero3_one_ring_over_every_rank_has_the_whole_node_network(n):
    """ZeRO-3/FSDP over all ranks: one ring, 8 ranks per node, every NIC carries one edge -
    the node's 100 Gb/s, not an eighth of it (the Figure 8 DeepSpeed rows' 8x)."""
    c = _gather(range(n))
    want = (n - 1) / n * c.bytes / (V100.inter_node_bandwidth * V100.network_efficiency)
    assert _beta(c, V100) == pytest.approx(want, rel=1e-9)


def test_tp_times_dp_groups_share_the_nic_and_p2p_pairs_get_one_share():
    """TP 8 x DP 8 on 64 ranks: each DP group has one rank per node, and the 8 DP groups of a
    node share its network (an eighth each); a pipeline's send between nodes likewise."""
    dp = _gather(range(0, 64, 8), kind="allreduce")
    want = 2 * 7 / 8 * dp.bytes / (V100.inter_node_bandwidth / 8 * V100.network_efficiency)
    assert _beta(dp, V100) == pytest.approx(want, rel=1e-9)
    p2p = CollectiveRecord("p2p", 10 ** 9, 2, (3, 11), "forward")
    assert _beta(p2p, V100) == pytest.approx(
        10 ** 9 / (V100.inter_node_bandwidth / 8 * V100.network_efficiency), rel=1e-9)
    # 2 ranks per node (TP 4 x DP): a quarter of the network each
    assert ring_bandwidth(tuple(range(0, 64, 4)), V100) == pytest.approx(
        V100.inter_node_bandwidth / 4)
    # inside a node: NVLink, whatever the group; the network never beats NVLink
    assert ring_bandwidth(tuple(range(8)), V100) == V100.intra_node_bandwidth
    fat = dataclasses.replace(V100, inter_node_bandwidth=10 * V100.intra_node_bandwidth)
    assert ring_bandwidth(tuple(range(16)), fat) == V100.intra_node_bandwidth
    # what the links reach: NVLink at link_efficiency, the network's share at its own
    assert ring_rate(tuple(range(8)), V100) == V100.intra_node_bandwidth * V100.link_efficiency
    assert ring_rate(tuple(range(0, 64, 8)), V100) == pytest.approx(
        V100.inter_node_bandwidth / 8 * V100.network_efficiency)
    assert V100.network_efficiency != V100.link_efficiency  # EFA v1 0.85, NVLink 0.80


def test_capacities_are_binary_gigabytes():
    assert PROFILES["v100-32gb"].memory_bytes == 32 * 2 ** 30
    assert PROFILES["a100-40gb"].memory_bytes == 40 * GIB
    assert PROFILES["a100-80gb"].memory_bytes == PROFILES["h100-80gb"].memory_bytes == 80 * GIB
    assert PROFILES["h200"].memory_bytes == 143771 * 2 ** 20


def test_every_gpu_profile_names_its_sources():
    for name, profile in PROFILES.items():
        assert name in SOURCES, name
        for key in ("device", "gemm_efficiency", "attention_efficiency", "memory_efficiency",
                    "reduction_efficiency",
                    "link_efficiency", "network_efficiency", "kernel_overhead_s", "host_op_s",
                    "reserved_bytes", "allocator_overhead", "overlap_slowdown"):
            assert SOURCES[name].get(key), (name, key)
        assert profile.sm_count > 0 and profile.compute_capability >= (7, 0), name
        assert profile.overlap_slowdown == 0.189, name  # Lee et al. 2025's average
    # DGX interconnects: 8 x 200 Gb/s (A100), 8 x 400 Gb/s (H100/H200), DGX-2: 16 GPUs
    assert PROFILES["a100-80gb"].inter_node_bandwidth == 8 * 200e9 / 8
    assert PROFILES["h100-80gb"].inter_node_bandwidth == 8 * 400e9 / 8
    assert PROFILES["v100-32gb-dgx2"].gpus_per_node == 16


def test_compute_beside_an_overlapped_collective_runs_slower():
    """An FSDP all-gather hidden by its phase's compute still costs that compute its
    contention (Lee et al. 2025: 18.9 % slower beside communication); one that outlasts the
    slowed compute costs the phase its own length; an exposed one is not slowed against."""
    h100 = PROFILES["h100-80gb"]
    s = h100.overlap_slowdown
    gemm = [OpRecord(10 ** 14, 0, "bfloat16", "forward", name="mm")]
    compute = rank_seconds(gemm, [], h100, set())["compute"]
    for size in (10 ** 8, 10 ** 11):  # hidden; longer than the slowed compute
        gather = CollectiveRecord("allgather", size, 8, tuple(range(8)), "forward")
        t = collective_seconds(gather, h100)
        step = rank_seconds(gemm, [gather], h100, {"allgather"})
        if t < compute:
            assert step["comm_exposed"] == 0 and step["comm_hidden"] == pytest.approx(t)
            assert step["contention"] == pytest.approx(t * s / (1 + s))
            assert step["total"] == pytest.approx(compute + t * s / (1 + s))
        else:
            assert step["total"] == pytest.approx(t) and step["contention"] == 0
        exposed = rank_seconds(gemm, [gather], h100, set())  # the runtime does not overlap it
        assert exposed["total"] == pytest.approx(compute + t) and exposed["contention"] == 0


def _gemm(m, n, k, batch=1, dtype="float16", name="mm"):
    flops = 2 * batch * m * n * k
    nbytes = 2 * batch * (m * k + k * n + m * n)
    return OpRecord(flops, nbytes, dtype, "forward", name=name, shape=(batch, m, n, k))


def test_gemm_efficiency_follows_tile_and_wave_quantisation():
    """A large GEMM runs at the profile's measured large-GEMM efficiency; one that leaves SMs
    idle in its last wave, or pads its tiles, runs slower per FLOP (NVIDIA's guide)."""
    assert tile_utilisation((1, 8192, 8192, 8192), 80) > 0.99
    # 108 SMs, 128 x 128 tiles of a 1 x 1 GEMM: one tile of 1 element
    assert tile_utilisation((1, 1, 1, 4096), 108) == pytest.approx(1 / (108 * 64 * 64))
    # 81 tiles of 128 x 128 on 80 SMs: two waves, the second nearly empty (64 x 64 tiles do
    # better: 324 tiles in 5 waves)
    assert tile_utilisation((1, 9 * 128, 9 * 128, 1024), 80) == pytest.approx(324 / 400)
    big = _gemm(8192, 8192, 8192)
    per_flop_big = (kernel_seconds(big, V100) - V100.kernel_overhead_s) / big.flops
    assert per_flop_big == pytest.approx(1 / (125e12 * V100.gemm_efficiency), rel=0.01)
    small = _gemm(1152, 1152, 8192)
    per_flop_small = (kernel_seconds(small, V100) - V100.kernel_overhead_s) / small.flops
    assert per_flop_small > 1.2 * per_flop_big
    # no shape (a convolution): the large-GEMM efficiency
    conv = dataclasses.replace(big, name="convolution", shape=())
    assert kernel_seconds(conv, V100) == pytest.approx(kernel_seconds(big, V100), rel=0.01)


def test_v100_gemm_efficiency_is_per_dtype():
    """A V100's large GEMM runs at Markidis et al.'s measured fraction of its own peak: 83 of
    125 TFLOP/s on Tensor Cores (fp16), 83 / 7 of 15.7 on CUDA cores (fp32, and bf16, which a
    V100 has no Tensor Core path for); other profiles have one efficiency for every dtype."""
    big = _gemm(8192, 8192, 8192)
    for dtype, peak, eff in (("float16", 125e12, 83 / 125), ("float32", 15.7e12, 83 / 7 / 15.7),
                             ("bfloat16", 15.7e12, 83 / 7 / 15.7)):
        op = dataclasses.replace(big, dtype=dtype)
        per_flop = (kernel_seconds(op, V100) - V100.kernel_overhead_s) / op.flops
        assert per_flop == pytest.approx(1 / (peak * eff), rel=0.01), dtype
    a100 = PROFILES["a100-80gb"]
    assert a100.gemm_efficiency_of("float32") == a100.gemm_efficiency_of("bfloat16") == 0.869
    assert "Markidis" in SOURCES["v100-32gb"]["fp32_gemm_efficiency"]


def test_fused_attention_runs_at_its_kernels_efficiency():
    a100 = PROFILES["a100-80gb"]
    flops = 10 ** 12
    flash = OpRecord(flops, 0, "float16", "forward", name="_scaled_dot_product_flash_attention")
    eff = dataclasses.replace(flash, name="_scaled_dot_product_efficient_attention_backward")
    t_flash = kernel_seconds(flash, a100) - a100.kernel_overhead_s
    t_eff = kernel_seconds(eff, a100) - a100.kernel_overhead_s
    assert t_flash == pytest.approx(flops / (312e12 * a100.attention_efficiency["flash"]))
    assert t_eff == pytest.approx(flops / (312e12 * a100.attention_efficiency["efficient"]))
    assert t_eff > t_flash


def test_a_phase_of_tiny_kernels_is_bound_by_the_host_issuing_them():
    tiny = [OpRecord(0, 64, "float16", "forward", name="add")] * 1000
    t = phase_seconds(tiny, V100)["forward"]
    assert t == pytest.approx(1000 * V100.host_op_s)
    assert V100.host_op_s > V100.kernel_overhead_s
    big = [_gemm(8192, 8192, 8192)] * 3  # long kernels: the GPU's time
    assert phase_seconds(big, V100)["forward"] == pytest.approx(
        3 * kernel_seconds(big[0], V100))
    assert math.isfinite(t)


@pytest.mark.parametrize("name", ["empty_like", "empty_strided", "new_empty_strided"])
def test_an_allocation_launches_no_kernel(name):
    """``empty_like`` and friends take memory from the caching allocator, and write nothing: on
    a GPU they cost no kernel time (fake tensors record their outputs' bytes as any op's)."""
    alloc = OpRecord(0, 2 * 2 ** 30, "float16", "forward", name=name)
    fill = dataclasses.replace(alloc, name="fill_")
    assert kernel_seconds(alloc, V100) == 0.0
    assert kernel_seconds(fill, V100) > 1e-3  # a kernel writing 2 GiB
    assert phase_seconds([alloc], V100)["forward"] == pytest.approx(V100.host_op_s)


def _reductions_of_a_layer() -> list:
    """The ops a real LayerNorm -> softmax -> log-softmax forward and backward record."""
    with FakeTensorMode():
        norm = torch.nn.LayerNorm(256)
        x = torch.randn(8, 128, 256, requires_grad=True)
        with StepRecorder() as rec:
            y = torch.log_softmax(torch.softmax(norm(x), -1), -1)
            y.sum().backward()
    return rec.ops


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_row_reductions_move_their_bytes_at_their_measured_fraction(name):
    """PyTorch's softmax and layer-norm kernels reach less of the HBM bandwidth than a stream
    (a block reduces a row, then rescales it): each moves its bytes at its direction's measured
    ``reduction_efficiency``, an ``add`` of the same bytes at ``memory_efficiency``. The names
    are what the recorder sees of a real forward and backward."""
    profile = PROFILES[name]
    ops = [op for op in _reductions_of_a_layer() if op.name in REDUCTION_KERNELS]
    assert {op.name for op in ops} >= {"native_layer_norm", "native_layer_norm_backward",
                                       "_softmax", "_softmax_backward_data", "_log_softmax",
                                       "_log_softmax_backward_data"}
    assert set(profile.reduction_efficiency) == {"forward", "backward"}
    for op in ops:
        share = profile.reduction_efficiency[REDUCTION_KERNELS[op.name]]
        assert 0 < share < profile.memory_efficiency
        assert kernel_seconds(op, profile) - profile.kernel_overhead_s == pytest.approx(
            op.bytes / (profile.memory_bandwidth * share))
        stream = dataclasses.replace(op, name="add")
        assert kernel_seconds(op, profile) > kernel_seconds(stream, profile)
    assert profile.reduction_efficiency["backward"] < profile.reduction_efficiency["forward"]


def test_an_op_that_returns_nothing_counts_the_arguments_it_writes():
    """A multi-tensor in-place op and a fused optimizer return ``()``: what they write is their
    mutable arguments, read and written (before, only read: AdamW's foreach step moved half
    its bytes); an ``out=`` list is written once; an in-place op returning its input counts it
    once as input and once as output."""
    def recorded(fn):
        with FakeTensorMode():
            tensors = [torch.empty(1000) for _ in range(4)]  # 4000 bytes each
            with StepRecorder() as rec:
                fn(*tensors)
        return {op.name: op.bytes for op in rec.ops}

    one = 4000
    assert recorded(lambda a, b, c, d: torch._foreach_mul_([a, b], 2.0)) == \
        {"_foreach_mul_": 4 * one}
    assert recorded(lambda a, b, c, d: a.mul_(2.0)) == {"mul_": 2 * one}
    out = recorded(lambda a, b, c, d: torch.split_with_sizes_copy(a, [500, 500], out=[
        b[:500], c[:500]]))
    assert out["split_with_sizes_copy"] == 2 * one  # a read, two halves written

    def adamw(p, g, m, v):
        step = torch.zeros(())
        torch._fused_adamw_([p], [g], [m], [v], [], [step], lr=1e-3, beta1=0.9, beta2=0.999,
                            weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)

    # reads p, g, m, v and the step count; writes p, m, v and (the schema marks them mutable) g
    assert recorded(adamw)["_fused_adamw_"] == 8 * one + 4
