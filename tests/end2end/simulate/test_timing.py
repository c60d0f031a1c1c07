"""The ``cpu`` time model (``end2end/simulate/cost/cpu_model.py``, ``timing.py``) on synthetic
records, its calibration file, and what the recorder gives it (op names, views, the CPU's fused
attention)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from end2end.simulate.cost.cpu_model import (Curve, EagerCpuModel, ThreadModel, interpolate,
                                        threads_per_rank)
from end2end.simulate.cost.records import OpRecord
from end2end.simulate.cost.timing import compute_seconds, rank_seconds

from end2end.simulate.cost.profiles import FORMAT

from slapo.errors import ConfigError


def _thread_model(threads: int, op_us: float = 10.0, peak: float = 1e11) -> ThreadModel:
    """A model whose GEMM rate rises 100x from 1 MFLOP to 1 TFLOP calls (peak at the end)."""
    rising = Curve(((1e6, peak / 100), (1e12, peak)))
    return ThreadModel(threads, {"float32": {"mm": rising, "bmm": rising}},
                       Curve(((1e3, 1e10), (1e9, 1e10))), {"_softmax": 4.0},
                       dict(forward=op_us * 1e-6, backward=2 * op_us * 1e-6,
                            optimizer=op_us * 1e-6 / 2),
                       dict(forward=op_us * 1e-7, backward=op_us * 1e-7, optimizer=0.0))


def _profile(one_thread: ThreadModel = None, all_cores: ThreadModel = None):
    from end2end.simulate.cost.profiles import PROFILES

    model = EagerCpuModel(2, {1: one_thread or _thread_model(1, peak=5e10),
                              2: all_cores or _thread_model(2, peak=1e11)})
    return dataclasses.replace(PROFILES["v100-32gb"], name="cpu", eager=model, link_efficiency=1.0,
                               collective_base_s=0.0)  # as the cpu file's profile


def _op(flops=0, nbytes=0, phase="forward", name="add", view=False) -> OpRecord:
    return OpRecord(flops, nbytes, "float32", phase, name=name, view=view)


def test_interpolation_is_linear_in_log_space_and_flat_beyond_the_points():
    points = ((10.0, 1.0), (1000.0, 100.0))
    assert interpolate(points, 100.0) == pytest.approx(10.0)  # the geometric middle
    assert interpolate(points, 1.0) == 1.0 and interpolate(points, 1e6) == 100.0
    curve = Curve(((1000.0, 100.0), (10.0, 1.0)))  # sorted on construction
    assert curve(31.6227766) == pytest.approx(math.sqrt(10), rel=1e-6)
    with pytest.raises(ValueError, match="positive"):
        Curve(((0.0, 1.0),))


def test_each_op_pays_the_measured_per_op_cost_by_phase():
    profile = _profile()
    model = profile.eager.for_ranks(1)
    tiny = [_op(nbytes=8) for _ in range(100)]
    assert compute_seconds(tiny, profile)["forward"] == pytest.approx(100 * 10e-6, rel=1e-3)
    more = tiny + [_op(nbytes=8) for _ in range(50)]
    extra = compute_seconds(more, profile)["forward"] - compute_seconds(tiny, profile)["forward"]
    assert extra == pytest.approx(50 * model.op_seconds["forward"], rel=1e-3)
    back = compute_seconds([_op(nbytes=8, phase="backward")] * 10, profile)["backward"]
    assert back == pytest.approx(10 * 20e-6, rel=1e-3)
    views = compute_seconds([_op(view=True, name="t")] * 10, profile)["forward"]
    assert views == pytest.approx(10 * 1e-6)  # views: their own (measured) cost


def test_small_gemms_are_slower_per_flop_than_large_ones():
    profile = _profile()
    small, large = 2 * 64 ** 3, 2 * 2048 ** 3
    t_small = compute_seconds([_op(small, 3 * 64 * 64 * 4, name="mm")], profile)["forward"]
    t_large = compute_seconds([_op(large, 3 * 2048 ** 2 * 4, name="mm")], profile)["forward"]
    per_flop_small = (t_small - 10e-6) / small
    per_flop_large = (t_large - 10e-6) / large
    assert per_flop_small > 5 * per_flop_large
    # a memory-bound op: bytes / bandwidth x the op's measured slowdown
    t_add = compute_seconds([_op(nbytes=4e8, name="add")], profile)["forward"]
    t_softmax = compute_seconds([_op(nbytes=4e8, name="_softmax")], profile)["forward"]
    assert t_add == pytest.approx(4e8 / 1e10 + 10e-6)
    assert t_softmax - 10e-6 == pytest.approx(4 * (t_add - 10e-6))


def test_threads_per_rank_follow_how_the_sweep_launches():
    assert threads_per_rank(2, 1) == 2 and threads_per_rank(2, 2) == 1
    assert threads_per_rank(16, 2) == 1  # torchrun: OMP_NUM_THREADS=1 for several processes
    profile = _profile()
    gemm = [_op(2 * 1024 ** 3, 3 * 1024 ** 2 * 4, name="mm")] * 4
    alone = rank_seconds(gemm, [], profile, set(), ranks_on_node=1)["total"]
    shared = rank_seconds(gemm, [], profile, set(), ranks_on_node=2)["total"]
    assert shared == pytest.approx(2 * alone, rel=0.05)  # one thread at half the rate
    # GPU profiles: views cost nothing and the thread count is irrelevant (unchanged model)
    from end2end.simulate.cost.profiles import PROFILES

    v100 = PROFILES["v100-32gb"]
    ops = gemm + [_op(view=True, name="t")] * 100
    assert compute_seconds(ops, v100) == compute_seconds(gemm, v100, ranks_on_node=8)


def test_ranks_share_dram_and_gloo_gets_no_spare_core():
    """Elementwise ops are capped at the rank's share of the machine's DRAM bandwidth; with
    every core running a rank nothing overlaps, and gloo's collectives have their measured
    bandwidth per kind."""
    from end2end.simulate.cost.records import CollectiveRecord

    profile = dataclasses.replace(_profile(), memory_bandwidth=4e9)  # below the 1e10 curve
    big = [_op(nbytes=4e8, name="add")]
    alone = compute_seconds(big, profile, ranks_on_node=1)["forward"] - 10e-6
    shared = compute_seconds(big, profile, ranks_on_node=2)["forward"] - 10e-6
    assert alone == pytest.approx(4e8 / 4e9) and shared == pytest.approx(4e8 / 2e9)
    gemm = [_op(2 * 1024 ** 3, 0, name="mm", phase="backward")]
    grads = [CollectiveRecord("allreduce", 10 ** 8, 2, (0, 1), "backward")]
    eager = profile.eager
    for cores, exposed in ((2, True), (4, False)):  # 2 ranks on 2 cores: no core to spare
        prof = dataclasses.replace(profile, eager=dataclasses.replace(eager, cores=cores))
        t = rank_seconds(gemm, grads, prof, {"allreduce"}, ranks_on_node=2)
        assert (t["comm_exposed"] > 0) == exposed and (t["comm_hidden"] > 0) != exposed
    slow = dataclasses.replace(profile, eager=dataclasses.replace(
        eager, collective_bandwidth={"allgather": profile.intra_node_bandwidth / 4}))
    gather = [CollectiveRecord("allgather", 10 ** 8, 2, (0, 1), "forward")]
    fast_t = rank_seconds([], gather, profile, set(), 2)["comm_exposed"]
    slow_t = rank_seconds([], gather, slow, set(), 2)["comm_exposed"]
    assert slow_t - profile.alpha_s == pytest.approx(4 * (fast_t - profile.alpha_s))


def _calibration_file(path, model: EagerCpuModel) -> str:
    path.write_text(json.dumps(dict(
        flops=dict(float32=1e11, bfloat16=1e11, float16=1e11), memory_bandwidth=1e10,
        bandwidth=1e9, alpha_s=1e-4, threads=2, cores=2, measured="test",
        memory_overhead=0.5, eager=model.to_json(), format=FORMAT)))
    return str(path)


def test_the_calibration_file_round_trips_and_an_old_one_is_refused(tmp_path):
    from end2end.simulate.calibration.cpu import cpu_profile

    model = dataclasses.replace(_profile().eager, runtime_seconds=ZERO3)
    profile = cpu_profile(_calibration_file(tmp_path / "cpu.json", model))
    assert profile.eager == model and profile.measured_overhead == 0.5
    assert profile.eager.runtime_seconds == ZERO3
    assert profile.alpha_s == 1e-4 and profile.flops["float32"] == 1e11
    old = tmp_path / "old.json"
    data = json.loads((tmp_path / "cpu.json").read_text())
    del data["eager"]
    old.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="no eager-PyTorch measurements") as err:
        cpu_profile(str(old))
    assert "python -m end2end.simulate.calibrate --out" in err.value.hint
    # a file of the previous format (no ZeRO-3 costs, no format field) is refused
    data = json.loads((tmp_path / "cpu.json").read_text())
    del data["format"], data["eager"]["runtime_seconds"]
    old.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=f"format 1, this simulator reads format {FORMAT}"
                       ) as err:
        cpu_profile(str(old))
    assert err.value.hint == f"re-measure it: python -m end2end.simulate.calibrate --out {old}"


ZERO3 = {f"zero3.{what}.{phase}": scale * k for what, scale in
         (("module", 1e-3), ("param", 1e-4), ("byte", 1e-9))
         for k, phase in ((1, "forward"), (2, "backward"), (3, "optimizer"))}


def test_zero3_costs_are_charged_by_module_parameter_and_byte_counts_on_cpu_only():
    from end2end.simulate.engine.modelled import zero3_costs
    from end2end.simulate.cost.profiles import PROFILES

    profile = _profile()
    profile = dataclasses.replace(profile, eager=dataclasses.replace(
        profile.eager, runtime_seconds=ZERO3))
    records = zero3_costs(modules=10, params=20, param_bytes=10 ** 6, dtype="float32")
    got = compute_seconds(records, profile, ranks_on_node=2)
    for k, phase in ((1, "forward"), (2, "backward"), (3, "optimizer")):
        want = k * (10 * 1e-3 + 20 * 1e-4 + 10 ** 6 * 1e-9)
        assert got[phase] == pytest.approx(want), (phase, got)
    # twice the modules: the module share doubles, nothing else moves
    more = compute_seconds(zero3_costs(20, 20, 10 ** 6, "float32"), profile, 2)
    assert more["forward"] - got["forward"] == pytest.approx(10 * 1e-3)
    # a calibration without them, and GPU profiles, charge nothing
    assert sum(compute_seconds(records, _profile(), 2).values()) == 0
    assert sum(compute_seconds(records, PROFILES["v100-32gb"]).values()) == 0
    # the records carry no FLOPs or bytes: the row's work totals do not change
    assert all(r.flops == 0 and r.bytes == 0 for r in records)


def test_zero3_under_gradient_accumulation_gathers_and_reduces_every_micro_batch():
    """With M micro-batches ZeRO-3 runs each one's forward and backward hooks, gathers and
    gradient reduce-scatter (it accumulates the reduced partitions); the optimizer's share
    stays once per step."""
    from end2end.simulate.engine.modelled import zero3_collectives, zero3_costs

    one = zero3_collectives([10 ** 6, 2 * 10 ** 6], 3 * 10 ** 6, (0, 1), True, False)
    three = zero3_collectives([10 ** 6, 2 * 10 ** 6], 3 * 10 ** 6, (0, 1), True, False, 3)
    assert len(one) == 5 and sorted(three, key=repr) == sorted(one * 3, key=repr)
    weights = {(r.phase, r.name): r.weight for r in zero3_costs(10, 20, 100, "float32", 3)}
    assert weights[("forward", "zero3.module")] == weights[("backward", "zero3.module")] == 30
    assert weights[("optimizer", "zero3.module")] == 10


def test_zero3_calibration_solves_its_three_models_back_to_the_costs():
    """:func:`calibrate_zero3.solve` on extra seconds made from known costs (and collectives
    the time model charges the bytes model, which it must take off) recovers the costs."""
    from end2end.simulate.calibration.zero3 import PHASES, _models, counts, solve

    n = {name: counts(build()) for name, (build, _) in _models().items()}
    comm = dict(forward=0.01, backward=0.02)
    extra = {name: {p: sum(c[w] * ZERO3[f"zero3.{w}.{p}"] for w in ("module", "param", "byte"))
                    + (comm.get(p, 0.0) if name == "bytes" else 0.0) for p in PHASES}
             for name, c in n.items()}
    got = solve(extra, comm)
    assert got == pytest.approx(ZERO3, rel=1e-6)
    assert n["modules"]["module"] == 65 and n["params"]["param"] == 256
    assert n["bytes"]["partitioned"] == 4 and n["modules"]["partitioned"] == 0
    assert n["bytes"]["byte"] == 4 * 2048 * 2048 * 4


def test_a_quick_measurement_has_every_curve_and_cost(tmp_path):
    """The calibration's code on small shapes (seconds): every number positive, each GEMM
    curve measured at several sizes and read back at its own points, the model usable. (Which
    size is faster per FLOP is the machine's business and its load's: not asserted.)"""
    from end2end.simulate.calibration.eager import measure_threads

    m = measure_threads(1, quick=True)
    assert set(m.gemm["float32"]) == {"mm", "bmm", "conv", "attention"}
    assert "mm" in m.gemm["bfloat16"]
    assert all(v > 0 for v in m.op_seconds.values()), m.op_seconds
    assert all(v >= 0 for v in m.view_seconds.values()), m.view_seconds
    assert {"_softmax", "native_dropout", "bernoulli_",
            "native_layer_norm_backward"} <= set(m.slowdown)
    mm = m.gemm["float32"]["mm"].points
    assert len({x for x, _ in mm}) >= 2, mm
    for flops, rate in mm:
        assert math.isfinite(rate) and rate > 0, mm
        assert m.rate("float32", "mm", flops) == pytest.approx(rate), (flops, mm)
    again = ThreadModel.from_json(json.loads(json.dumps(m.to_json())))
    assert again == m


def test_the_recorder_names_ops_records_views_and_counts_cpu_fused_attention():
    from end2end.simulate.engine.recorder import StepRecorder

    q, k, v = (torch.randn(1, 2, 16, 8, requires_grad=True) for _ in range(3))
    with StepRecorder() as rec:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=False)
        out.transpose(1, 2).sum().backward()
    names = {op.name for op in rec.ops}
    attention = [op for op in rec.ops if "flash_attention_for_cpu" in op.name]
    assert len(attention) == 2, names  # forward and backward
    full = 4 * 1 * 2 * 16 * 16 * 8  # 4 B H Lq Lk d
    assert attention[0].flops == full and attention[1].flops == full * 5 // 2
    assert any(op.view and op.name == "transpose" for op in rec.ops), names
    assert all(op.flops == 0 and op.bytes == 0 for op in rec.ops if op.view)
    # fake tensors' metadata queries (prim.device) are no ops
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.randn(4, 4)
        with StepRecorder() as rec:
            torch.ops.prim.device.default(x)
            (x + 1).sum()
    assert [op.name for op in rec.ops] == ["add", "sum"], [op.name for op in rec.ops]


@pytest.mark.timeout(600)
def test_zero3_costs_measured_with_a_real_engine_on_two_ranks():
    """The calibration's ZeRO-3 part for real (DeepSpeed on 2 gloo ranks, two timed steps per
    model): every cost present and finite, and DeepSpeed's module hooks cost something (they
    run Python per module in forward and backward)."""
    from end2end.simulate.calibration.zero3 import KEYS, measure_zero3

    costs = measure_zero3(dict(alpha_s=1e-4, collective_bandwidth=dict(allreduce=1e9)), steps=2)
    assert set(costs) == set(KEYS)
    assert all(math.isfinite(v) and v >= 0 for v in costs.values()), costs
    assert costs["zero3.module.forward"] + costs["zero3.module.backward"] > 1e-5, costs


def test_an_ops_extra_arithmetic_runs_at_the_in_cache_rate_of_its_measurement():
    """The slowdown (measured in cache) prices the arithmetic an op does beyond an add's; moving
    the bytes pays the size's bandwidth and the DRAM cap, the arithmetic does not: a softmax
    (slowdown 4) on a rank capped at 4e9 B/s moves 4e8 B at 4e9 and computes 3 x 4e8 B at the
    curve's 1e10 (before: 4 x 4e8 / 4e9, the arithmetic charged at the cap too)."""
    capped = dataclasses.replace(_profile(), memory_bandwidth=4e9)
    softmax = compute_seconds([_op(nbytes=4e8, name="_softmax")], capped)["forward"] - 10e-6
    assert softmax == pytest.approx(4e8 / 4e9 + 3 * 4e8 / 1e10)
    # at the curve's own rate (no cap) the measured slowdown is reproduced: 4 x an add
    free = _profile()
    add = compute_seconds([_op(nbytes=4e8, name="add")], free)["forward"] - 10e-6
    assert compute_seconds([_op(nbytes=4e8, name="_softmax")], free)["forward"] - 10e-6 == \
        pytest.approx(4 * add)
    # where the curve falls (page faults on large outputs), only the moving slows down
    falling = dataclasses.replace(_thread_model(2), bandwidth=Curve(((1e3, 1e10), (1e8, 1e10),
                                                                     (1e9, 1e9))))
    slow = falling.elementwise_seconds("_softmax", 1e9)
    assert slow == pytest.approx(1e9 / 1e9 + 3 * 1e9 / 1e10)


def test_eager_dropout_on_a_cpu_is_recorded_as_the_bernoulli_draw_the_calibration_prices():
    """F.dropout on a CPU runs ``empty_like(x).bernoulli_(1 - p)``, ``div_``, ``mul``: the
    recorder sees ``bernoulli_`` (what the profile of BERT's ZeRO-3 step showed: 13 calls, 6 % of
    the step), and the calibration measures a slowdown under that name."""
    from end2end.simulate.calibration.eager import _elementwise_cases
    from end2end.simulate.engine.recorder import StepRecorder

    x = torch.randn(64, 512, requires_grad=True)
    with StepRecorder() as rec:
        torch.nn.functional.dropout(x, 0.1, training=True).sum().backward()
    names = [op.name for op in rec.ops]
    assert "bernoulli_" in names and "native_dropout" not in names, names
    assert "bernoulli_" in _elementwise_cases(2 ** 10)
    profile = _profile()
    slow = dataclasses.replace(profile.eager.per_threads[1], slowdown={"bernoulli_": 30.0})
    draw = [op for op in rec.ops if op.name == "bernoulli_"][0]
    fixed = slow.fixed_seconds(draw)
    plain = dataclasses.replace(slow, slowdown={})
    assert slow.op_time(draw) - fixed == pytest.approx(30 * (plain.op_time(draw) - fixed))


def test_the_memory_relation_is_the_line_through_the_two_reference_runs():
    from end2end.simulate.calibration.cpu import affine_memory

    # measured = 0.2 GB + 1.25 x simulated through both points, whichever order
    line = affine_memory([(0.2e9, 0.45e9), (0.6e9, 0.95e9)])
    assert line["memory_overhead"] == pytest.approx(0.25)
    assert line["memory_fixed_bytes"] == pytest.approx(0.2e9)
    assert affine_memory([(0.6e9, 0.95e9), (0.2e9, 0.45e9)]) == pytest.approx(line)
    # a slope below 1 (noise) falls back to the proportional model through the larger run
    flat = affine_memory([(0.2e9, 0.9e9), (0.6e9, 1.0e9)])
    assert flat == {"memory_overhead": pytest.approx(1.0 / 0.6 - 1), "memory_fixed_bytes": 0.0}
