"""``build(target="megatron")``: a Slapo model under megatron-core's runtime (parallel state,
forward-backward schedule, RNG tracker) matches the single-process reference."""

import pytest
import torch
import torch.distributed as dist

import slapo
from slapo.runtime.distributed import teardown
from slapo.testing import run_distributed

from .reference import gpt, rank_batch, reference_losses, sgd, tp_schedule_gpt2

STEPS = 3


def _train(runtime, batch):
    return [runtime.train_step(batch) for _ in range(STEPS)]


def _tp2_then_dp2():
    from megatron.core import parallel_state as ps

    from slapo.dialects.megatron import initialize_megatron

    batch = rank_batch(dist.get_rank())  # TP ranks train on their group's first rank's batch
    tp_group = initialize_megatron(2, seed=7)
    tp_seed_streams = sorted(slapo.get_rng_tracker().states)
    sch = slapo.create_schedule(gpt(), group=tp_group)
    tp_schedule_gpt2(sch)
    runtime, _ = slapo.build(sch, target="megatron", optimizer=sgd)
    sharded = runtime.module.transformer.h[0].mlp.c_fc.weight.shape
    tp_losses = _train(runtime, batch)
    teardown()  # megatron state only: the test harness owns the default group
    assert not ps.model_parallel_is_initialized()

    group = initialize_megatron(1)
    with pytest.raises(slapo.BuildError, match="is not megatron's tensor-parallel group"):
        slapo.build(slapo.create_schedule(gpt()), target="megatron")  # group None = world
    with pytest.raises(slapo.BuildError, match="num_microbatches must be a positive int"):
        slapo.build(slapo.create_schedule(gpt(), group=group), target="megatron",
                    num_microbatches=0)
    runtime, _ = slapo.build(slapo.create_schedule(gpt(), group=group), target="megatron",
                             optimizer=sgd, num_microbatches=2)
    dp_losses = _train(runtime, batch)
    return dict(tp=tp_losses, dp=dp_losses, sharded=tuple(sharded), streams=tp_seed_streams)


def test_megatron_tp2_and_dp2_match_single_process_reference():
    results = run_distributed(_tp2_then_dp2, 2)
    ref_tp = reference_losses(world=1, steps=STEPS)  # rank 0's batch only
    ref_dp = reference_losses(world=2, steps=STEPS)  # the union of both ranks' batches
    for r in results:
        assert r["sharded"] == (32, 32)  # c_fc [32, 64] split over 2 ranks
        assert r["streams"] == ["model-parallel-rng"]
        torch.testing.assert_close(r["tp"], ref_tp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r["dp"], ref_dp, rtol=1e-5, atol=1e-5)


def test_megatron_cpu_shim_is_reversible():
    from slapo.dialects.compat import megatron_cpu

    if torch.cuda.is_available():
        pytest.skip("the shim is only applied on CPU")
    before = (torch.cuda.current_device, torch.cuda.get_rng_state)
    with megatron_cpu.megatron_cpu_shim() as active:
        assert active and megatron_cpu.megatron_cpu_shim_active()
        assert megatron_cpu.apply_megatron_cpu_shim()  # idempotent
        assert torch.cuda.current_device() == torch.device("cpu")
        torch.cuda.manual_seed(3)
        state = torch.cuda.get_rng_state()
        torch.manual_seed(3)
        assert torch.equal(state, torch.get_rng_state())
    assert not megatron_cpu.megatron_cpu_shim_active()
    assert (torch.cuda.current_device, torch.cuda.get_rng_state) == before


def test_pipeline_cuts_not_supported_yet():
    sch = slapo.create_schedule(gpt())
    sch["transformer.h.1"].metadata["cut_pipeline_stage"] = True
    with pytest.raises(slapo.BuildError, match="pipeline stages.*not yet supported by target "
                                               "'megatron'"):
        slapo.build(sch, target="megatron")
