"""fp32 masters in the optimizer (:mod:`end2end.driver.megatron_optimizer`): Megatron-LM's mixed
precision in the ``megatron`` and ``slapo-megatron`` modes, and apex O2's in the plain-PyTorch
modes (``eager`` under DDP, ``slapo``) when the run asks for ``fp32_masters``. In bf16/fp16 the
model is cast, megatron-core's ``Float16OptimizerWithFloat16Params`` keeps fp32 masters and fp32
Adam moments (12 bytes per parameter beyond the model's weights and gradients), the model is the
masters cast down after every step, the masters follow fp32 AdamW on the (unscaled) gradients
exactly, the masters bring bf16 closer to the fp32 run than the cast model's own AdamW, and fp16
skips an overflowing step with the scale halving after Megatron-LM's hysteresis of 2. On 1 rank
and on 2 gloo ranks (TP 2; ``eager``: DDP over the same batch), one spawn per world size."""

import math

import pytest
import torch

from slapo.errors import ConfigError
from slapo.testing import example_inputs, run_distributed, tiny_config
from tests.dialects.reference import tp_schedule_gpt2

STEPS = 4
MODES = (("megatron", None), ("slapo-megatron", tp_schedule_gpt2), ("eager", None),
         ("slapo", tp_schedule_gpt2))
PLAIN = ("eager", "slapo")  # masters only where the run asks (fp32_masters)


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-3)


def _runner(mode, schedule, dtype, tp, fp32_masters=True):
    from end2end.driver.runtimes import make_runner, with_fp32_masters

    masters = mode in PLAIN and fp32_masters
    return make_runner(mode, tiny_config("gpt2", use_cache=False), schedule=schedule,
                       optimizer=with_fp32_masters(_adamw) if masters else _adamw, dtype=dtype,
                       tensor_parallel=None if mode == "eager" else tp)


def _batch(dp):
    """The same batch on every rank (TP), or each rank its own (data parallel)."""
    return example_inputs("gpt2", seed=torch.distributed.get_rank() if dp else 0)


def _dp_average(grads):
    """What the runtime does to gradients over data-parallel ranks: one flat all-reduce (AVG)
    in the model's dtype."""
    flat = torch._utils._flatten_dense_tensors(grads)
    torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.AVG)
    return list(torch._utils._unflatten_dense_tensors(flat, grads))


def _ddp_average(grads):
    """What DDP does to gradients: each divided by the world size in the model's dtype, then
    summed over the ranks (in fp16 the division rounds a subnormal gradient)."""
    world = torch.distributed.get_world_size()
    out = [g / world for g in grads]
    for g in out:
        torch.distributed.all_reduce(g)
    return out


def _record_grads(model):
    """The model's gradients as backward leaves them (before the optimizer takes them)."""
    seen = {}
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(
            lambda p, name=name: seen.__setitem__(name, p.grad.detach().clone()))
    return seen


def _states(runner):
    """(fp32 state bytes, parameter count, dtypes of the moments, masters are the model cast)."""
    from end2end.driver.megatron_optimizer import master_parameters

    opt = runner.optimizer
    params = [p for p in runner.model.parameters()]
    masters = master_parameters(opt)
    moments = [v for s in opt.state.values() for k, v in s.items() if k != "step"]
    cast_ok = all(torch.equal(p, m.to(p.dtype)) for p, m in zip(params, masters))
    return (sum(t.numel() * t.element_size() for t in masters + moments),
            sum(p.numel() for p in params), {str(t.dtype) for t in masters + moments}, cast_ok)


def _train_against_reference(mode, schedule, dtype, tp, dp=False):
    """Steps the runner; after each step the masters must equal fp32 AdamW stepped by hand on
    fp32 copies with the unscaled (data-parallel averaged) gradients, and the model the masters
    cast down."""
    from end2end.driver.megatron_optimizer import MegatronMixedPrecisionOptimizer

    runner = _runner(mode, schedule, dtype, tp)
    opt, model = runner.optimizer, runner.model
    assert isinstance(opt, MegatronMixedPrecisionOptimizer)
    assert {p.dtype for p in model.parameters()} == {dtype}
    if dtype == torch.float16:  # past the start-up overflows of Megatron-LM's scale of 2**32
        opt.grad_scaler._scale.fill_(2.0 ** 10)
    names = [n for n, _ in model.named_parameters()]
    ref = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    ref_opt = _adamw(ref)
    grads, out = _record_grads(model), {"losses": [], "skipped": 0, "cast": []}
    for _ in range(STEPS):
        scale = float(opt.get_loss_scale())
        out["losses"].append(runner.train_step(_batch(dp)))
        local = [grads[n] for n in names]
        if mode == "eager" and torch.distributed.get_world_size() > 1:
            local = _ddp_average(local)  # DDP over the same batch on every rank
        g = [t.float() / scale for t in (_dp_average(local) if dp else local)]
        out.setdefault("grad_norm", float(torch.cat([t.flatten() for t in g]).norm()))
        if not all(bool(t.isfinite().all()) for t in g):
            out["skipped"] += 1
            continue
        for r, gr in zip(ref, g):
            r.grad = gr
        ref_opt.step()
        torch.testing.assert_close([m.detach() for m in opt.fp32_from_float16_groups[0]],
                                   [r.detach() for r in ref], rtol=0, atol=0)
        out["cast"].append(_states(runner)[3])
    out["states"] = _states(runner)[:3]
    runner.close()
    return out


def _fp16_overflow(world):
    """Inject inf into one rank's gradient of one weight: every rank skips (model-parallel
    vote), nothing changes, the scale halves on the second overflow in a row."""
    runner = _runner("megatron", None, torch.float16, world)
    opt, model = runner.optimizer, runner.model
    opt.grad_scaler._scale.fill_(2.0 ** 10)  # past the start-up overflows of 2**32
    weight = next(p for n, p in model.named_parameters() if n.endswith("linear_fc1.weight"))
    before = [p.detach().clone() for p in model.parameters()]
    hook = weight.register_hook(lambda g: torch.full_like(g, math.inf)
                                if torch.distributed.get_rank() == 0 else g)
    scales, unchanged = [], []
    for _ in range(2):
        runner.train_step(example_inputs("gpt2"))
        scales.append(float(opt.get_loss_scale()))
        unchanged.append(all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
                         and not opt.state)
    hook.remove()
    runner.train_step(example_inputs("gpt2"))
    moved = not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    runner.close()
    return {"scales": scales, "unchanged": unchanged, "moved": moved}


def _fp32_and_cast_losses(world):
    """The fp32 run's losses, and the old cast-model AdamW's (bf16 model, bf16 moments) of the
    megatron baseline."""
    from end2end.driver.baselines.megatron_core import build_megatron_model, megatron_loss_fn
    from slapo.dialects.megatron import MegatronRuntime

    fp32 = _runner("megatron", None, None, world)
    exact = [fp32.train_step(example_inputs("gpt2")) for _ in range(STEPS)]
    fp32.close()
    cfg = tiny_config("gpt2", use_cache=False)
    model = build_megatron_model(cfg, world, seed=0).to(torch.bfloat16)
    old = MegatronRuntime(model, _adamw(model.parameters()), megatron_loss_fn(cfg))
    cast = [old.train_step(example_inputs("gpt2")) for _ in range(STEPS)]
    from slapo.runtime.distributed import teardown

    teardown()
    return exact, cast


def _plain_fp32_and_cast_losses():
    """The plain-PyTorch ``eager`` run's losses in fp32 and as the cast bf16 model with bf16
    moments (no ``fp32_masters``)."""
    out = []
    for dtype in (None, torch.bfloat16):
        runner = _runner("eager", None, dtype, 1, fp32_masters=False)
        assert not hasattr(runner.optimizer, "fp32_from_float16_groups") or dtype is None
        out.append([runner.train_step(example_inputs("gpt2")) for _ in range(STEPS)])
        runner.close()
    return out


def _all(world):
    out = {(mode, str(dtype)): _train_against_reference(mode, schedule, dtype, world)
           for mode, schedule in MODES for dtype in (torch.bfloat16, torch.float16)}
    out["plain_fp32"], out["plain_cast"] = _plain_fp32_and_cast_losses()
    if world > 1:  # TP 1 x DP 2: each rank its own batch, gradients averaged before the step
        out["dp"] = _train_against_reference("megatron", None, torch.bfloat16, 1, dp=True)
    out["overflow"] = _fp16_overflow(world)
    out["fp32"], out["cast"] = _fp32_and_cast_losses(world)
    return out


@pytest.mark.parametrize("world", [1, 2])
def test_megatron_modes_keep_fp32_masters(world):
    for out in run_distributed(_all, world, world, timeout=600):
        for mode, _ in MODES:
            for dtype in ("torch.bfloat16", "torch.float16"):
                run = out[(mode, dtype)]
                state_bytes, params, dtypes = run["states"]
                assert dtypes == {"torch.float32"}, (mode, dtype, dtypes)
                assert state_bytes == 12 * params, (mode, dtype, state_bytes, params)
                assert run["cast"] and all(run["cast"]), (mode, dtype, run)
                assert all(math.isfinite(x) for x in run["losses"]), (mode, dtype, run)
                assert run["skipped"] == 0, (mode, dtype, run)
            # the loss was scaled before the backward: the fp16 model's gradients, unscaled,
            # are the bf16 model's (a loss scale the backward never saw reads 2**-10 off)
            fp16, bf16 = (out[(mode, d)]["grad_norm"] for d in ("torch.float16",
                                                                 "torch.bfloat16"))
            assert abs(fp16 / bf16 - 1) < 0.05, (mode, fp16, bf16)
        # (b) the masters make bf16 follow fp32 closer than the cast model's AdamW does
        for mode, fp32, cast in (("megatron", out["fp32"], out["cast"]),
                                 ("eager", out["plain_fp32"], out["plain_cast"])):
            mixed = out[(mode, "torch.bfloat16")]["losses"]
            assert mixed[0] == cast[0], mode
            err_mixed = sum(abs(a - b) for a, b in zip(mixed[1:], fp32[1:]))
            err_cast = sum(abs(a - b) for a, b in zip(cast[1:], fp32[1:]))
            assert err_mixed < err_cast, (mode, mixed, cast, fp32)
        if world > 1:
            assert all(out["dp"]["cast"]) and len(out["dp"]["cast"]) == STEPS, out["dp"]
        # (c) fp16 overflow: skipped on every rank, the scale halves on the second in a row
        over = out["overflow"]
        assert over["scales"] == [2.0 ** 10, 2.0 ** 9], over
        assert over["unchanged"] == [True, True] and over["moved"], over


def test_fp32_runs_keep_the_torch_optimizer_and_bad_dtypes_are_refused():
    from end2end.driver.megatron_optimizer import (megatron_optimizer_factory,
                                                   mixed_precision_optimizer)

    assert megatron_optimizer_factory(_adamw, None) is _adamw
    assert megatron_optimizer_factory(_adamw, torch.float32) is _adamw
    with pytest.raises(ConfigError, match="float16 or torch.bfloat16"):
        mixed_precision_optimizer([torch.nn.Parameter(torch.zeros(2))], torch.float32, _adamw)
    mixed = [torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16)),
             torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ConfigError, match="also has torch.float32 parameters"):
        mixed_precision_optimizer(mixed, torch.bfloat16, _adamw)


def test_modes_without_master_weights_refuse_fp32_masters():
    from end2end.driver.runtimes import make_runner, with_fp32_masters

    for mode, pp, match in (("dtensor-tp", 1, "mode 'dtensor-tp' trains the model cast"),
                            ("hf-tp", 1, "mode 'hf-tp' trains the model cast"),
                            ("slapo", 2, "the torch pipeline of mode 'slapo'")):
        with pytest.raises(ConfigError, match=match):
            make_runner(mode, tiny_config("gpt2"), dtype=torch.bfloat16,
                        optimizer=with_fp32_masters(_adamw), pipeline_parallel=pp)


def test_fused_step_of_the_masters_steps_as_the_loop():
    """``use_fused_step`` (what the driver does on CUDA, the simulator on a GPU profile) turns the
    inner AdamW fused; the masters then move as the per-parameter loop moves them. A form the
    user chose stays, and an optimizer without a fused form is left alone."""
    from end2end.driver.megatron_optimizer import mixed_precision_optimizer

    def stepped(fused, base=_adamw):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(8, 4).bfloat16()) for _ in range(3)]
        opt = mixed_precision_optimizer(params, torch.bfloat16, base, vote_group=None)
        assert opt.use_fused_step() == fused
        assert all(bool(g.get("fused")) == fused for g in opt.optimizer.param_groups)
        for step in range(2):
            opt.zero_grad()
            for p in params:
                p.grad = torch.full_like(p, 0.1 * (step + 1))
            opt.step()
        return [m.detach().clone() for g in opt.fp32_from_float16_groups for m in g]

    import torch.distributed as dist

    from slapo.runtime.distributed import init_distributed, teardown

    init_distributed()  # the overflow vote's default group (one rank)
    try:
        fused = stepped(True)
        loop = stepped(False, lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=False))
        torch.testing.assert_close(fused, loop)
        assert not stepped(False, lambda ps: torch.optim.RMSprop(ps))[0].isnan().any()
        assert dist.is_initialized()
    finally:
        teardown()
