"""The candidate space and the rules that prune it before any simulation: every candidate is a
config line the driver accepts, no candidate breaks a divisibility rule, the memory lower bound
prunes models that cannot fit, and the simulation queue reaches every mode first."""

import pytest

from end2end.models import get_model_spec
from end2end.models.zoo import FAMILIES
from end2end.plan.cluster import parse_cluster
from end2end.plan.estimate import estimate_memory, estimate_seconds
from end2end.plan.rules import MEGATRON_FAMILIES, memory_lower_bound, parameter_count
from end2end.plan.search import Evaluated, _dominated_by_oom, _queue
from end2end.plan.space import PLANNED_MODES, enumerate_space
from end2end.spec.config_file import expand, parse_lines
from end2end.spec.layout import run_layout

from slapo.errors import ConfigError

# 6 heads, 2 key/value heads, 6 layers: TP 4 and PP 4 cannot split it
ODD = "llama:layers=6,hidden=96,heads=6,kv_heads=2,ffn=256,vocab=512,max_positions=128"


def test_every_candidate_is_a_config_line_the_driver_accepts():
    cluster = parse_cluster("h100-80gb:4x1")
    space = enumerate_space("tiny/llama", cluster, 64, 16, "bf16")
    assert {c.mode for c in space.candidates} == set(PLANNED_MODES)
    # slapo without a pipeline shards over every rank: only tp = n (the driver would run
    # tp=1 on 4 ranks as TP 4 while its row says TP 1)
    assert not [c for c in space.candidates if c.mode == "slapo" and c.pp == 1]  # 2 kv heads
    two = enumerate_space("tiny/llama", parse_cluster("h100-80gb:2x1"), 64, 8, "bf16")
    assert {c.tp for c in two.candidates if c.mode == "slapo" and c.pp == 1} == {2}
    for cand in space.candidates:
        (spec,) = expand(parse_lines(cand.line.splitlines(), "plan"))  # the line as a config
        layout = run_layout(spec)
        assert (layout.tp, layout.pp, layout.dp) == (cand.tp, cand.pp, cand.dp)
        assert layout.micro_batch_size == cand.micro
        assert cand.dp * cand.micro * cand.accumulation == cand.batch == 16
        assert layout.num_microbatches == cand.accumulation
        assert spec.dtype == "bf16" and spec.n == 4


def test_every_mode_is_searched_with_gradient_accumulation_too():
    """Micro-batches below the replica's batch in the modes that are neither megatron nor
    pipelined (the driver accumulates gradients in every mode): powers of two and the whole
    batch; the line names its micro-batch only when it accumulates."""
    space = enumerate_space("tiny/llama", parse_cluster("h100-80gb:2x1"), 64, 16, "bf16")
    for mode in ("fsdp", "deepspeed", "eager", "slapo-fsdp"):
        cands = [c for c in space.candidates if c.mode == mode and c.tp == 1]
        assert {c.micro for c in cands} == {1, 2, 4, 8}, mode  # replica batch 8
        for c in cands:
            assert ("micro_batch=" in c.pragma) == (c.accumulation > 1), c.label


def test_divisibility_prunes_tp_and_pp_that_do_not_split_the_model():
    cluster = parse_cluster("h100-80gb:4x1")
    space = enumerate_space(ODD, cluster, 64, 16, "bf16")
    assert space.candidates and space.pruned["divisibility"] > 0
    assert all(c.tp in (1, 2) and c.pp in (1, 2) for c in space.candidates)
    assert "does not divide" in space.examples["divisibility"]


def test_tp_stays_inside_a_node():
    space = enumerate_space("tiny/llama", parse_cluster("h100-80gb:2x2"), 64, 16, "bf16")
    assert max(c.tp for c in space.candidates) == 2
    assert "GPUs per node" in space.examples["divisibility"]


def test_megatron_only_for_the_families_megatron_core_builds():
    from end2end.driver.baselines.megatron_core import _FAMILIES

    assert set(MEGATRON_FAMILIES) == {t for _, types in _FAMILIES for t in types} & set(FAMILIES)
    space = enumerate_space("tiny/qwen3", parse_cluster("h100-80gb:2x1"), 64, 8, "bf16")
    assert "megatron" not in {c.mode for c in space.candidates}
    assert space.pruned["mode"] == 1 and "slapo-megatron" in {c.mode for c in space.candidates}


def test_the_memory_lower_bound_prunes_a_model_that_cannot_fit():
    one_v100 = parse_cluster("v100-32gb:1x1")
    space = enumerate_space("llama-7b", one_v100, 512, 1, "fp16")
    assert not space.candidates and space.pruned["memory"] > 0
    spec = get_model_spec("llama-7b")
    assert 6.4e9 < parameter_count(spec) < 7.0e9  # 6.7 B, the embedding counted once

    def states(mode, dp, tp=1, pp=1):  # ckpt 1, 1 token: (almost) only the states
        return memory_lower_bound(spec, mode, "fp16", tp, pp, dp, 1, 1, 1.0)

    sixteen = 16 * parameter_count(spec)  # fp32 master + 2 moments + fp16 weight and gradient
    assert states("deepspeed", 1) == pytest.approx(sixteen, rel=1e-3)
    assert states("deepspeed", 8) == pytest.approx(sixteen / 8, rel=1e-3)  # ZeRO-3: / DP
    assert states("megatron", 8, tp=2) == pytest.approx(sixteen / 2, rel=1e-3)  # DP replicates
    assert states("slapo-deepspeed", 2, tp=2, pp=2) == pytest.approx(sixteen / 4, rel=1e-3)
    assert states("eager", 8) == pytest.approx(8 * parameter_count(spec), rel=1e-3)  # cast


def test_a_model_that_fits_nowhere_is_one_line(capsys):
    from end2end.plan.__main__ import main

    assert main(["llama-7b", "--cluster", "v100-32gb:1x1", "--seq", "512"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fits no layout on v100-32gb:1x1" in err[0] and "memory" in err[0]


def test_the_queue_takes_every_mode_first_then_the_estimate_order():
    cluster = parse_cluster("h100-80gb:4x1")
    space = enumerate_space("tiny/llama", cluster, 64, 16, "bf16")
    items = [Evaluated(c, estimate_seconds(c, cluster), estimate_memory(c, cluster) / 1e9)
             for c in space.candidates]
    queue = _queue(items, cluster.memory_bytes)
    assert len(queue) == len(items)
    assert {e.candidate.mode for e in queue[:len(PLANNED_MODES)]} == set(PLANNED_MODES)
    rest = [e.estimate["total"] for e in queue[2 * len(PLANNED_MODES):]]
    assert rest == sorted(rest)


def test_a_predicted_oom_prunes_what_holds_as_much_or_more():
    space = enumerate_space("tiny/llama", parse_cluster("h100-80gb:2x1"), 64, 8, "bf16")
    meg = [c for c in space.candidates if c.mode == "megatron" and c.tp == 2]
    oom = next(c for c in meg if c.micro == 2 and c.ckpt == "selective")
    dominated = {(c.micro, c.ckpt) for c in meg if _dominated_by_oom(c, oom)}
    assert dominated == {(m, c) for m in (2, 4, 8) for c in ("0", "selective")}


def test_an_unknown_model_is_the_zoo_error():
    with pytest.raises(ConfigError, match="unknown model"):
        enumerate_space("llama-8x", parse_cluster("h100-80gb:2x1"), 64, 8, "bf16")


def test_after_an_oom_the_mode_s_next_candidate_goes_first_until_one_fits():
    from end2end.plan.predict import Prediction
    from end2end.plan.search import _next_of_mode_first

    cluster = parse_cluster("h100-80gb:2x1")
    space = enumerate_space("tiny/llama", cluster, 64, 8, "bf16")
    items = [Evaluated(c, {"total": 1.0}, 1.0) for c in space.candidates]
    oom = next(e for e in items if e.candidate.mode == "megatron")
    oom.prediction = Prediction("sim-oom")
    queue = [e for e in items if e is not oom]
    _next_of_mode_first(queue, "megatron", [oom], [oom.candidate])
    first = queue[0].candidate
    assert first.mode == "megatron" and not _dominated_by_oom(first, oom.candidate)
    fitted = Evaluated(first, {"total": 1.0}, 1.0, Prediction("sim"))
    before = list(queue)
    _next_of_mode_first(queue, "megatron", [oom, fitted], [oom.candidate])
    assert queue == before  # a fitting megatron candidate exists: the order stays


def test_an_oom_s_next_candidate_waits_for_the_other_modes_first_candidates():
    from end2end.plan.search import _next_of_mode_first

    space = enumerate_space("tiny/llama", parse_cluster("h100-80gb:2x1"), 64, 8, "bf16")
    items = [Evaluated(c, {"total": 1.0}, 1.0) for c in space.candidates]
    oom = next(e.candidate for e in items if e.candidate.mode == "megatron")
    queue = [e for e in items if e.candidate is not oom]
    _next_of_mode_first(queue, "megatron", [], [oom], first=3)
    assert queue[3].candidate.mode == "megatron" and queue[:3] == [
        e for e in items if e.candidate is not oom][:3]


def test_slapo_modes_also_try_op_checkpointing_and_its_order_against_the_ratios():
    from end2end.plan.ckpt import activation_sbh, checkpointed_share, ckpt_choices, holds_at_least

    space = enumerate_space("tiny/llama", parse_cluster("h100-80gb:2x1"), 64, 8, "bf16")
    ops = [c for c in space.candidates if c.ckpt == "op"]
    assert {c.mode for c in ops} == {"slapo", "slapo-megatron", "slapo-deepspeed", "slapo-fsdp"}
    for cand in ops:  # the driver reads it as every layer checkpointed with the op policy
        spec = cand.run_spec()
        assert spec.ckpt_ratio == 1.0 and spec.ckpt_policy == "save_every_other_matmul"
    assert "op" not in ckpt_choices("slapo-fsdp", vision=True)  # the driver refuses it there
    assert "op" not in ckpt_choices("megatron") and "op" not in ckpt_choices("fsdp")
    # what a layer keeps: more than a checkpointed layer's input, less than a whole layer
    for tp in (1, 2, 8):
        assert activation_sbh("1", tp) < activation_sbh("op", tp) < activation_sbh("0", tp)
    assert checkpointed_share("op") == 1.0  # the lower bound: every layer's input only
    assert holds_at_least("0", "op") and holds_at_least("op", "1")
    assert not holds_at_least("op", "0") and not holds_at_least("1", "op")
    assert not holds_at_least("op", "0.5") and not holds_at_least("0.5", "op")
    assert holds_at_least("0", "0.5") and not holds_at_least("1", "0.5")


def test_an_oom_at_op_prunes_ratio_0_but_not_0_5():
    space = enumerate_space("tiny/llama", parse_cluster("h100-80gb:2x1"), 64, 8, "bf16")
    fsdp = [c for c in space.candidates if c.mode == "slapo-fsdp" and c.tp == 1]
    oom = next(c for c in fsdp if c.ckpt == "op")
    assert {c.ckpt for c in fsdp if _dominated_by_oom(c, oom)} == {"0", "op"}


def test_sequence_parallel_is_searched_where_the_recipe_and_layout_take_it():
    """The recipe's knob (issue 40, item 1): every Slapo candidate with TP > 1 (pipelines too)
    of a recipe that declares sequence parallelism comes with and without it, the knob last in
    the pragma and in the run spec; nowhere else (baselines, TP 1, BERT)."""
    cluster = parse_cluster("h100-80gb:4x1")
    space = enumerate_space("tiny/llama", cluster, 64, 16, "bf16")
    sp = [c for c in space.candidates if c.knobs]
    assert sp and {c.knobs for c in sp} == {"sequence_parallel=True"}
    assert all(c.is_slapo and c.tp > 1 for c in sp) and any(c.pp > 1 for c in sp)
    plain = {(c.mode, c.tp, c.pp, c.micro, c.ckpt) for c in space.candidates
             if not c.knobs and c.is_slapo and c.tp > 1}
    assert plain == {(c.mode, c.tp, c.pp, c.micro, c.ckpt) for c in sp}
    cand = sp[0]
    assert cand.pragma.endswith(" knobs=sequence_parallel=True") and "[sequence_par" in cand.label
    assert cand.run_spec().knobs == "sequence_parallel=True" and cand.sequence_parallel
    bert = enumerate_space("tiny/bert", cluster, 64, 16, "bf16")
    assert not [c for c in bert.candidates if c.knobs]


def test_sequence_parallel_divides_the_activations_in_the_bounds_and_estimates():
    from dataclasses import replace

    spec = get_model_spec("llama-7b")
    whole, split = (memory_lower_bound(spec, "slapo-fsdp", "bf16", 8, 1, 4, 2, 4096, 1.0, sp)
                    for sp in (False, True))
    states = parameter_count(spec) * 16 / (8 * 4)  # TP 8 x FSDP 4
    assert (split - states) == pytest.approx((whole - states) / 8, rel=1e-3)
    cluster = parse_cluster("h100-80gb:8x4")
    cand = next(c for c in enumerate_space("llama-7b", cluster, 2048, 32, "bf16",
                                           modes=("slapo-fsdp",)).candidates
                if c.tp == 8 and not c.knobs)
    with_sp = replace(cand, knobs="sequence_parallel=True")
    assert estimate_memory(with_sp, cluster) < estimate_memory(cand, cluster)
    assert estimate_seconds(with_sp, cluster) == estimate_seconds(cand, cluster)
    # an OOM with sequence parallelism prunes the same layout without it, not the reverse
    assert _dominated_by_oom(cand, with_sp) and not _dominated_by_oom(with_sp, cand)
