"""Build targets for schedules with pipeline cuts: ``torch`` (torch.distributed.pipelining) and
``deepspeed`` (PipelineModule + train_batch) train a 2-stage tiny GPT-2 like one process does."""

import os

import pytest
import torch
import torch.distributed as dist

import slapo
from slapo.dialects.deepspeed_pipeline import (
    decode_activations,
    deepspeed_stage,
    encode_activations,
    pipeline_items,
)
from slapo.dialects.layout import ParallelLayout
from slapo.runtime.distributed import teardown
from slapo.pipeline import build_pipeline_stages
from slapo.testing import example_inputs, run_distributed, tiny_model

from .reference import sgd, tp_schedule_gpt2

STEPS = 3
# no gradient clipping (DeepSpeed's default clips at 1.0); 2 micro-batches of 2 per replica
DS_CONFIG = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
             "gradient_clipping": 0.0, "steps_per_print": 1000}


def gpt():
    return tiny_model("gpt2", n_layer=4, use_cache=False)


def pipelined(cuts=("transformer.h.1",)):
    sch = slapo.create_schedule(gpt())
    sch.trace_until("transformer", example_inputs=example_inputs("gpt2", batch=4))
    for cut in cuts:
        sch[cut].cut_pipeline_stage()
    return sch


def batch(step: int, replica: int = 0):
    return example_inputs("gpt2", batch=4, seq=8, seed=100 * step + replica)


def reference(replicas: int = 1):
    """One process, SGD, on the union of the replicas' batches."""
    model = gpt()
    opt = sgd(model.parameters())
    losses = []
    for step in range(STEPS):
        parts = [batch(step, r) for r in range(replicas)]
        union = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        loss = model(**union).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


# ---------------------------------------------------------------------- on 2 ranks
def _released(whole: torch.nn.Module, stage: torch.nn.Module) -> tuple:
    """(other stages' tensors all emptied, this stage's all kept) on this rank."""
    mine = {id(t) for t in [*stage.parameters(), *stage.buffers()]}
    tensors = [*whole.parameters(), *whole.buffers()]
    return (all(t.numel() == 0 for t in tensors if id(t) not in mine),
            all(t.numel() > 0 for t in tensors if id(t) in mine))


def _torch_and_deepspeed():
    rank = dist.get_rank()
    sch = pipelined()
    model, opt = slapo.build(sch, optimizer=sgd, n_microbatches=2, pipeline_schedule="1f1b")
    torch_losses = [model.train_step(batch(s)) for s in range(STEPS)]
    out = dict(torch=torch_losses, torch_keys=sorted(model.state_dict()),
               torch_opt=sum(p.numel() for g in opt.param_groups for p in g["params"]),
               stage_params=sum(p.numel() for p in model.parameters()),
               torch_released=_released(sch.mod, model.module))

    sch = pipelined()
    engine, _ = slapo.build(sch, target="deepspeed", optimizer=sgd, config=DS_CONFIG)
    ds_losses = [float(engine.train_batch(pipeline_items(engine, batch(s))))
                 for s in range(STEPS)]
    layer = engine.module.get_submodule(str(rank))
    out.update(ds=ds_losses, ds_keys=sorted(layer.state_dict()),
               ties=[c["ranks"] for c in engine.module.tied_comms.values()],
               ds_released=_released(sch.mod, layer))
    return out


def test_torch_and_deepspeed_pipelines_match_single_process():
    ref = reference()
    results = run_distributed(_torch_and_deepspeed, 2, timeout=300)
    for r in results:
        torch.testing.assert_close(r["torch"], ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r["ds"], ref, rtol=1e-5, atol=1e-5)
        assert r["torch_opt"] == r["stage_params"]  # the optimizer holds this stage only
        assert r["ties"] == [[0, 1]]  # wte (stage 0) = lm_head (stage 1)
        # only this rank's stage stays in memory (the tied wte/lm_head weight included)
        assert r["torch_released"] == (True, True) and r["ds_released"] == (True, True)
    assert ref[-1] < ref[0]
    original = set(gpt().state_dict())
    for key in ("torch_keys", "ds_keys"):
        keys = [k for r in results for k in r[key]]
        assert set(keys) == original  # original paths, each stage a part of the model
        assert set(results[0][key]) != set(results[1][key])


def _data_and_pipeline_parallel():
    """4 ranks = 2 stages x 2 replicas (replica r trains on batch(step, r)), then 2 stages x
    tensor parallelism 2."""
    replica = ParallelLayout.for_world(4, tp=1, pp=2).coords(dist.get_rank()).replica
    model, _ = slapo.build(pipelined(), optimizer=sgd, n_microbatches=2)
    torch_losses = [model.train_step(batch(s, replica)) for s in range(STEPS)]
    engine, _ = slapo.build(pipelined(), target="deepspeed", optimizer=sgd, config=DS_CONFIG)
    ds_losses = [float(engine.train_batch(pipeline_items(engine, batch(s, replica))))
                 for s in range(STEPS)]
    out = dict(torch=torch_losses, ds=ds_losses,
               ties=[c["ranks"] for c in engine.module.tied_comms.values()])

    # tensor x pipeline parallel: TP groups [0, 1] [2, 3], stages on {0, 1} and {2, 3}
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    tp_group = groups[dist.get_rank() // 2]
    for target, kwargs in (("torch", {}), ("deepspeed", {"config": DS_CONFIG})):
        sch = slapo.create_schedule(gpt(), group=tp_group)
        tp_schedule_gpt2(sch)
        sch.trace_until("transformer", example_inputs=example_inputs("gpt2", batch=4))
        sch["transformer.h.1"].cut_pipeline_stage()
        model, _ = slapo.build(sch, target=target, optimizer=sgd, **kwargs)
        out["c_fc"] = tuple(sch["transformer.h.0.mlp.c_fc"].mod.weight.shape)
        if target == "torch":
            out["tp_torch"] = [model.train_step(batch(s)) for s in range(STEPS)]
        else:
            out["tp_ds"] = [float(model.train_batch(pipeline_items(model, batch(s))))
                            for s in range(STEPS)]
    return out


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SLAPO_SLOW_TESTS") != "1",
                    reason="4 ranks: ~1-2 min on 2 shared cores; set SLAPO_SLOW_TESTS=1")
def test_data_parallel_pipelines_match_single_process():
    ref, ref_one = reference(replicas=2), reference(replicas=1)
    results = run_distributed(_data_and_pipeline_parallel, 4, timeout=500)
    for rank, r in enumerate(results):
        torch.testing.assert_close(r["torch"], ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r["ds"], ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r["tp_torch"], ref_one, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r["tp_ds"], ref_one, rtol=1e-5, atol=1e-5)
        assert r["c_fc"] == (32, 32)  # [32, 64] split over 2 tensor-parallel ranks
        assert r["ties"] == [[rank % 2, rank % 2 + 2]]  # pipelines [0, 2] and [1, 3]


# ---------------------------------------------------------------------- errors, no ranks
def test_world_too_small_for_the_stages():
    try:
        with pytest.raises(slapo.BuildError, match=r"does not divide the world size 1.*"
                                                    r"Hint: launch a multiple of 2 ranks"):
            slapo.build(pipelined(), optimizer=sgd)
    finally:
        teardown()


def test_pipeline_option_errors():
    with pytest.raises(slapo.BuildError, match="n_microbatches.*only apply to schedules with "
                                               "pipeline cuts"):
        slapo.build(slapo.create_schedule(gpt()), n_microbatches=2)
    with pytest.raises(slapo.ConfigError, match="unknown pipeline_schedule 'zb'"):
        slapo.build(pipelined(), pipeline_schedule="zb")
    with pytest.raises(slapo.BuildError, match="ZeRO stage 3 cannot be combined"):
        slapo.build(pipelined(), target="deepspeed",
                    config={"zero_optimization": {"stage": 3}})
    with pytest.raises(slapo.BuildError, match="mpu cannot be given"):
        slapo.build(pipelined(), target="deepspeed", config={}, mpu=object())
    with pytest.raises(slapo.BuildError, match="takes no argument 'input_idz'.*Hint: did you "
                                               "mean 'input_ids'"):
        slapo.build(pipelined(), target="deepspeed", config={}, input_names=["input_idz"])


# ---------------------------------------------------------------------- pieces
def test_layout_arithmetic():
    lay = ParallelLayout.for_world(8, tp=2, pp=2)
    assert (lay.tp, lay.dp, lay.pp) == (2, 2, 2)
    assert lay.tp_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert lay.pp_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert lay.dp_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert lay.coords(5) == (1, 0, 1) and lay.rank(*lay.coords(5)) == 5
    assert all(lay.rank(*lay.coords(r)) == r for r in range(8))
    assert lay.stage_groups([3, 0]) == lay.stage_groups([0, 3])
    four = ParallelLayout.for_world(8, tp=1, pp=4)
    assert four.stage_groups([0, 3]) == [[0, 6], [1, 7]]  # first and last stage, per replica
    with pytest.raises(slapo.BuildError, match=r"3 pipeline stage\(s\) x tensor-parallel size 1"):
        ParallelLayout.for_world(4, tp=1, pp=3)


def test_deepspeed_stages_chain_like_the_model():
    """The DeepSpeed layers (tuple in, encoded tuple out) compose to the model's loss, and
    bools / grad-less floats survive the integer encoding."""
    stages = build_pipeline_stages(pipelined())
    names = ["input_ids", "attention_mask", "labels"]
    layers = [deepspeed_stage(st, names, loss_in_stage=True) for st in stages]
    assert [sorted(layer.state_dict()) for layer in layers] == \
        [sorted(st.state_dict()) for st in stages]
    inputs = example_inputs("gpt2", batch=2, seq=8)
    sent = layers[0](tuple(inputs[n] for n in names))
    assert not any(t.dtype == torch.bool for t in sent)
    loss = layers[1](sent)
    torch.testing.assert_close(loss, gpt()(**inputs).loss)

    values = (torch.randn(2, 3, requires_grad=True), torch.randn(2), torch.rand(4) > 0.5,
              torch.arange(3))
    enc = encode_activations(values)
    assert [t.dtype for t in enc] == [torch.float32, torch.int32, torch.uint8, torch.int64,
                                      torch.int64]
    for a, b in zip(decode_activations(enc), values):
        assert a.dtype == b.dtype and torch.equal(a, b)
    items = list(pipeline_items(_FakeEngine(names), inputs))
    assert len(items) == 2 and items[0][0][0].shape == (1, 8)


class _FakeEngine:
    def __init__(self, names):
        self.module = type("M", (), {"input_names": names})()

    def gradient_accumulation_steps(self):
        return 2
