"""Tracing for a mixed-precision runtime (``slapo.compute_dtype``, issue #39): a module traced
inside the block keeps its fp32 parameters, runs exactly like the untraced module when its
parameters are computed in the low dtype (as FSDP2's policy and DeepSpeed's engine do: parameters
cast, buffers kept), and refuses an fp32 run with one line (the dtype it baked is not stale
silently). Traced without the block, the low-precision run still refuses. The 2-rank runs
under the real runtimes are in tests/end2end/driver/test_low_precision_traces.py."""

import copy

import pytest
import torch

import slapo
from slapo.testing import assert_same_training, example_inputs, tiny_model

RUN = dict(batch=3, seq=5)
CASES = [("llama", "model.layers.0", dict(flatten=True)),
         ("llama", "model", dict()),
         ("t5", "encoder.block.0", dict(flatten=True)),
         ("gpt2", "transformer", dict())]
IDS = ["llama-layer", "llama-model", "t5-block", "gpt2-transformer"]


def _as_runtime_computes(model, dtype):
    """The model as FSDP2's MixedPrecisionPolicy / DeepSpeed's engine computes it: floating
    parameters in ``dtype``, buffers as they are."""
    model = copy.deepcopy(model)
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def _traced(family, path, dtype, **options):
    ref, model = tiny_model(family, use_cache=False), tiny_model(family, use_cache=False)
    masters = {n: p for n, p in model.named_parameters()}
    with slapo.compute_dtype(dtype):
        slapo.create_schedule(model)[path].trace(example_inputs=example_inputs(family),
                                                 **options)
    return ref, model, masters


@pytest.mark.parametrize("family,path,options", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_traced_for_the_compute_dtype_runs_as_the_runtime_computes(family, path, options,
                                                                   dtype):
    ref, model, masters = _traced(family, path, dtype, **options)
    # the masters are untouched: the same fp32 Parameter objects
    assert {n: p for n, p in model.named_parameters()} == masters
    assert all(p.dtype == torch.float32 for p in masters.values())
    tol = dict(rtol=0.0, atol=0.0)  # the same operations in the same dtype: bit for bit
    assert_same_training(_as_runtime_computes(ref, dtype), _as_runtime_computes(model, dtype),
                         example_inputs(family, **RUN), **tol)


@pytest.mark.parametrize("family,path,options", CASES[:3], ids=IDS[:3])
def test_traced_for_bf16_refuses_an_fp32_run(family, path, options):
    _, model, _ = _traced(family, path, torch.bfloat16, **options)
    with pytest.raises(slapo.TraceError, match=r"traced with \S+\.dtype = torch.bfloat16 .* "
                       r"but it is torch.float32 now") as e:
        model(**example_inputs(family, **RUN))
    assert "\n" not in str(e.value)


def test_traced_in_fp32_still_refuses_the_low_precision_run():
    _, model, _ = _traced("llama", "model.layers.0", None, flatten=True)
    with pytest.raises(slapo.TraceError, match=r"torch.float32 .* but it is torch.bfloat16 "
                       r"now.*slapo.compute_dtype") as e:
        _as_runtime_computes(model, torch.bfloat16)(**example_inputs("llama", **RUN))
    assert "\n" not in str(e.value)


def test_a_model_already_in_the_dtype_traces_as_without_the_block():
    ref, model = tiny_model("llama", use_cache=False), tiny_model("llama", use_cache=False)
    ref, model = ref.to(torch.bfloat16), model.to(torch.bfloat16)
    with slapo.compute_dtype(torch.bfloat16):
        slapo.create_schedule(model)["model"].trace(example_inputs=example_inputs("llama"))
    assert_same_training(ref, model, example_inputs("llama", **RUN), rtol=0.0, atol=0.0)


def test_inputs_given_directly_are_cast_and_the_block_is_undone():
    model = tiny_model("llama", use_cache=False)
    hidden = torch.randn(2, 8, model.config.hidden_size)
    with slapo.compute_dtype(torch.bfloat16):
        with slapo.compute_dtype(None):  # an inner block without a compute dtype
            assert slapo.trace.compute_dtype.active_compute_dtype() is None
        slapo.create_schedule(model)["model.norm"].trace(inputs=((hidden,), {}))
    assert slapo.trace.compute_dtype.active_compute_dtype() is None
    norm = model.model.norm
    with pytest.raises(slapo.TraceError, match="torch.bfloat16"):
        norm(hidden)
    bf16 = _as_runtime_computes(norm, torch.bfloat16)
    assert bf16(hidden.to(torch.bfloat16)).dtype == torch.bfloat16


def test_refusals():
    with pytest.raises(slapo.TraceError, match="not a floating-point torch dtype") as e:
        with slapo.compute_dtype(torch.int64):
            pass
    assert "\n" not in str(e.value)
    model = tiny_model("llama", use_cache=False)
    with pytest.raises(slapo.TraceError, match="dynamo tracer cannot trace for the compute "
                       "dtype torch.bfloat16.*Hint: use the default tracer") as e:
        with slapo.compute_dtype(torch.bfloat16):
            slapo.create_schedule(model)["model.layers.0.mlp"].trace(
                example_inputs=example_inputs("llama"), tracer="dynamo")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("family,path,options", CASES[1:3], ids=IDS[1:3])
def test_traced_under_autocast_is_exact_under_it_and_exact_or_refusing_without(family, path,
                                                                               options):
    """The other way to compute in low precision: ``torch.autocast`` over the fp32 model.
    Trace inside the same autocast (no ``compute_dtype``)."""
    ref, model = tiny_model(family, use_cache=False), tiny_model(family, use_cache=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        slapo.create_schedule(model)[path].trace(example_inputs=example_inputs(family),
                                                 **options)
    inputs = example_inputs(family, **RUN)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert_same_training(ref, model, inputs, rtol=0.0, atol=0.0)
    try:  # without autocast: LLaMA's dtype reads are fp32 either way, T5's are not
        assert_same_training(ref, model, inputs, rtol=0.0, atol=0.0)
    except slapo.TraceError as e:
        assert family == "t5" and "\n" not in str(e), e
        assert "= torch.bfloat16" in str(e) and "but it is torch.float32 now" in str(e)
