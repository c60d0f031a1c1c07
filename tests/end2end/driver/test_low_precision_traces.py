"""Traced schedules under the driver's low-precision runtimes (issue #39), on 2 gloo ranks:

* a pipeline (``slapo-deepspeed --pp 2 --dtype bf16``): DeepSpeed's bf16 engine casts the
  stages after the schedule traced them, so the driver casts the model before the schedule
  (commit 949d374); before, every such run failed on the trace's dtype guard ("'model' was
  traced with embed_tokens.dtype = torch.float32 ... but it is torch.bfloat16 now"). Its first
  loss is the untraced bf16 model's;
* the mixed-precision runtimes that keep the fp32 model (FSDP2's ``MixedPrecisionPolicy``,
  ``slapo-fsdp`` bf16 and fp16; DeepSpeed ZeRO-3's bf16 engine, ``slapo-deepspeed``) with a
  schedule that traces: the driver traces inside ``slapo.compute_dtype(dtype)``, so the traced
  run's losses and gradients are the untraced run's, bit for bit; traced in fp32 instead, the
  run still refuses with one line (the dtype the trace fixed is never used silently).

(DeepSpeed refuses fp16 on a CPU: "Type fp16 is not supported on your device".)"""

import math

import pytest
import torch
import torch.distributed as dist

import slapo
from slapo.testing import example_inputs, run_distributed, tiny_config

MIXED = (("slapo-fsdp", torch.bfloat16), ("slapo-fsdp", torch.float16),
         ("slapo-deepspeed", torch.bfloat16))
STEPS = 2


def _sgd(params):
    return torch.optim.SGD(params, lr=0.5)


def _trace_layers(sch):
    sch.trace_until(["model.layers.0", "model.layers.1"],
                    example_inputs=example_inputs("llama"))


def _trace_layers_in_fp32(sch):
    with slapo.compute_dtype(None):
        _trace_layers(sch)


def _full_grads(runner):
    """Every parameter's whole gradient after a step's backward (collective)."""
    from deepspeed.utils import safe_get_full_grad

    grads = {}
    for name, p in runner.model.named_parameters():
        g = safe_get_full_grad(p) if hasattr(p, "ds_id") else p.grad
        grads[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).float().clone()
    return grads


def _step_with_grads(runner, batch):
    """One training step of the runner's runtime; the gradients read before the optimizer step
    (DeepSpeed's are partitioned and gone after it)."""
    model = runner.model
    if hasattr(model, "backward"):  # DeepSpeed's engine
        loss = model(**batch).loss
        model.backward(loss)
        grads = _full_grads(runner)
        model.step()
        return loss.item(), grads
    loss = runner.train_step(batch)
    return loss, _full_grads(runner)


def _mixed_precision_run(mode, dtype, schedule):
    from end2end.driver.runtimes import make_runner

    batch = example_inputs("llama", batch=2, seq=8, seed=dist.get_rank())  # one per rank
    runner = make_runner(mode, tiny_config("llama", use_cache=False), schedule=schedule,
                         optimizer=_sgd, dtype=dtype)
    try:
        return [_step_with_grads(runner, batch) for _ in range(STEPS)]
    except slapo.TraceError as e:
        return str(e)
    finally:
        runner.close()


def _pipelined_bf16():
    """The driver's own run (spec, layout, runner, batch) and the untraced model's loss."""
    from end2end.driver.assemble import build_runner, rank_batch
    from end2end.models import build_model, get_model_spec
    from end2end.spec.config_file import make_run_spec
    from end2end.spec.layout import run_layout

    spec = make_run_spec("slapo-deepspeed", "tiny/llama", 2, 16, 0, 4, "0", steps=1,
                         warmup=0, dtype="bf16", pp=2)
    layout, device = run_layout(spec), torch.device("cpu")
    runner = build_runner(spec, layout, spec.low_precision_dtype, device)
    batch = rank_batch(spec, layout, dist.get_rank(), device, spec.low_precision_dtype)
    losses = [runner.train_step(batch) for _ in range(STEPS)]
    runner.close()
    reference = build_model(get_model_spec("tiny/llama"), seed=0).to(torch.bfloat16)
    micro = layout.micro_batch_size
    with torch.no_grad():
        parts = [reference(**{k: v[i:i + micro] for k, v in batch.items()}).loss.item()
                 for i in range(0, layout.local_batch, micro)]
    return losses, sum(parts) / len(parts)


def _all():
    out = {}
    for mode, dtype in MIXED:
        for name, schedule in (("untraced", None), ("traced", _trace_layers)):
            out[mode, str(dtype), name] = _mixed_precision_run(mode, dtype, schedule)
    out["fp32 trace"] = _mixed_precision_run("slapo-fsdp", torch.bfloat16,
                                             _trace_layers_in_fp32)
    out["pipeline"] = _pipelined_bf16()  # last: a DeepSpeed pipeline leaves global state
    return out


@pytest.mark.timeout(600)
def test_traced_schedules_under_low_precision_runtimes():
    results = run_distributed(_all, 2, timeout=560)
    for out in results:
        (losses, reference) = out["pipeline"]
        assert all(math.isfinite(x) for x in losses) and losses[1] < losses[0], losses
        torch.testing.assert_close(losses[0], reference, rtol=1e-4, atol=1e-4)
        for mode, dtype in MIXED:
            untraced = out[mode, str(dtype), "untraced"]
            traced = out[mode, str(dtype), "traced"]
            assert isinstance(traced, list), (mode, dtype, traced)
            assert isinstance(untraced, list), (mode, dtype, untraced)
            for (loss, grads), (ref_loss, ref_grads) in zip(traced, untraced):
                assert math.isfinite(ref_loss) and loss == ref_loss, (mode, dtype)
                assert grads.keys() == ref_grads.keys() and grads
                for name in grads:
                    torch.testing.assert_close(grads[name], ref_grads[name], rtol=0.0,
                                               atol=0.0, msg=lambda m, n=name: f"{n}: {m}")
            assert traced[1][0] < traced[0][0], (mode, dtype, traced)  # it trains
        refusal = out["fp32 trace"]
        assert isinstance(refusal, str) and "\n" not in refusal, refusal
        assert "torch.float32" in refusal and "but it is torch.bfloat16 now" in refusal
        assert "slapo.compute_dtype" in refusal
