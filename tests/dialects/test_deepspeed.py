"""``build(target="deepspeed")``: ZeRO-3 matches the single-process reference; errors."""

import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import slapo
from slapo.testing import run_distributed

from .reference import STEPS, gpt, rank_batch, reference_losses, sgd, train

# DeepSpeed 0.19 clips gradients at norm 1.0 by default; the reference does not clip.
ZERO3 = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
         "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}


def _torch_ddp_and_zero3():
    from slapo.dialects.deepspeed import TensorParallelMPU

    batch = rank_batch(dist.get_rank())
    model, opt = slapo.build(slapo.create_schedule(gpt()), optimizer=sgd)
    ddp_losses = train(DistributedDataParallel(model), opt, batch)

    engine, ds_opt = slapo.build(slapo.create_schedule(gpt()), target="deepspeed",
                                 optimizer=sgd, config=ZERO3)
    sharded = all(p.ds_tensor.numel() < p.ds_numel for p in engine.module.parameters())
    ds_losses = []
    for _ in range(STEPS):
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
        loss = loss.detach().clone()
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        ds_losses.append(loss.item())

    whole = TensorParallelMPU(None)  # TP = world -> data-parallel groups of one
    groups = [dist.new_group([r]) for r in range(dist.get_world_size())]
    own = TensorParallelMPU(groups[dist.get_rank()])  # TP groups of one -> DP = world
    return dict(ddp=ddp_losses, ds=ds_losses, sharded=sharded,
                mpu=[(m.get_tensor_model_parallel_world_size(), m.get_data_parallel_world_size(),
                      m.get_tensor_model_parallel_rank(), m.get_data_parallel_rank())
                     for m in (whole, own)])


def test_zero3_and_ddp_match_single_process_reference():
    ref = reference_losses()
    results = run_distributed(_torch_ddp_and_zero3, 2)
    for r in results:
        torch.testing.assert_close(r["ddp"], ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r["ds"], ref, rtol=1e-5, atol=1e-5)
        assert r["sharded"], "ZeRO-3 did not partition the parameters"
    assert ref[-1] < ref[0]
    assert [r["mpu"] for r in results] == [[(2, 1, 0, 0), (1, 2, 0, 0)],
                                           [(2, 1, 1, 0), (1, 2, 0, 1)]]


def test_build_errors():
    sch = slapo.create_schedule(gpt())
    with pytest.raises(slapo.BuildError, match="needs a DeepSpeed config dict.*Hint: pass e.g."):
        slapo.build(sch, target="deepspeed")
    with pytest.raises(slapo.BuildError, match="does not take option.*n_microbatches"):
        slapo.build(sch, target="deepspeed", config={}, n_microbatches=2)
    with pytest.raises(slapo.BuildError, match="input_names.*only apply to schedules with "
                                               "pipeline cuts"):
        slapo.build(sch, target="deepspeed", config={}, input_names=["input_ids"])


def test_missing_deepspeed_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import deepspeed -> ImportError
    with pytest.raises(slapo.BuildError, match="DeepSpeed is not installed.*DS_BUILD_OPS=0"):
        slapo.build(slapo.create_schedule(gpt()), target="deepspeed", config={})


def test_no_build_config():
    from slapo.dialects.compat.deepspeed_startup import no_build_config

    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    out = no_build_config(cfg, torch_optimizer=False)
    assert out["optimizer"]["params"] == {"lr": 1e-3, "torch_adam": True}
    assert "torch_adam" not in cfg["optimizer"]["params"]  # input untouched
    assert no_build_config({}, torch_optimizer=True)["zero_allow_untested_optimizer"] is True


def test_import_slapo_imports_no_framework():
    code = ("import sys, slapo, slapo.dialects.deepspeed, slapo.dialects.megatron; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('deepspeed', 'megatron')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
