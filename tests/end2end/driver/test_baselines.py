"""Baselines and runners of the benchmark: megatron-core's GPT/BERT/T5 built from HF configs
train at TP=1 and TP=2 with equal losses; every mode's runner trains the same tiny GPT (one
spawn for both)."""

import math

import torch
import torch.distributed as dist

from slapo.runtime.distributed import teardown
from slapo.testing import example_inputs, run_distributed, tiny_config
from tests.dialects.reference import tp_schedule_gpt2

FAMILIES = ("gpt2", "bert", "t5")
STEPS = 3


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1)


def _baselines():
    from end2end.driver.baselines.megatron_core import build_megatron_model, megatron_loss_fn
    from slapo.dialects.megatron import MegatronRuntime

    out = {}
    for tp in (2, 1):  # TP=1 on 2 ranks is data parallel on the same batch
        for family in FAMILIES:
            cfg = tiny_config(family)
            model = build_megatron_model(cfg, tp, seed=5)
            runtime = MegatronRuntime(model, _sgd(model.parameters()), megatron_loss_fn(cfg))
            out[(family, tp)] = [runtime.train_step(example_inputs(family))
                                 for _ in range(STEPS)]
            out[(family, tp, "params")] = sum(p.numel() for p in model.parameters())
        teardown()
    return out


def _runners():
    from end2end.driver.runtimes import make_runner

    batch = example_inputs("gpt2")  # the same batch on both ranks
    cfg = tiny_config("gpt2", use_cache=False)
    out = {}
    for mode, schedule in (("slapo-megatron", tp_schedule_gpt2), ("megatron", None),
                           ("deepspeed", None), ("slapo-deepspeed", None)):
        runner = make_runner(mode, cfg, schedule=schedule, optimizer=_sgd,
                             ckpt=mode == "deepspeed")
        out[mode] = [runner.train_step(batch) for _ in range(2)]
        runner.close()
    out["rank"] = dist.get_rank()
    return out


def _both():  # one spawn: importing megatron and DeepSpeed costs seconds per rank
    return _baselines(), _runners()


def test_megatron_core_baselines_and_runners():
    results = run_distributed(_both, 2)
    check_baselines(results[0][0])
    check_runners([r for _, r in results])


def check_baselines(out):
    for family in FAMILIES:
        tp2, tp1 = out[(family, 2)], out[(family, 1)]
        assert all(math.isfinite(x) for x in tp1 + tp2), (family, tp1, tp2)
        assert tp2[-1] < tp2[0] and tp1[-1] < tp1[0], (family, tp1, tp2)
        # same seed, weights drawn from the full master weight: same model at TP=1 and TP=2
        torch.testing.assert_close(tp2[0], tp1[0], rtol=1e-5, atol=1e-5)
        assert out[(family, 1, "params")] > out[(family, 2, "params")]


def check_runners(results):
    for r in results:
        for mode in ("slapo-megatron", "megatron", "deepspeed", "slapo-deepspeed"):
            assert all(math.isfinite(x) for x in r[mode]) and r[mode][1] < r[mode][0], (mode, r)
        # same seed and batch: the HF-model modes start from the same loss
        torch.testing.assert_close(r["slapo-megatron"][0], r["deepspeed"][0])
        torch.testing.assert_close(r["slapo-deepspeed"], r["deepspeed"])
