"""slapo.op.rms_norm: the one-function RMSNorm equals HF's T5LayerNorm and LlamaRMSNorm (outputs,
input and weight gradients) in float32/float64, takes HF's maths in half precision, and the T5 /
LLaMA recipes put it in place with ``fuse`` (numerics of the whole models: tests/model_schedule)."""

import copy

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.t5.modeling_t5 import T5LayerNorm

from slapo import SlapoError
from slapo.model_schedule import apply_schedule
from slapo.op.rms_norm import RMSNorm, rms_norm
from slapo.testing import tiny_model


def _hf(cls, dtype):
    torch.manual_seed(0)
    mod = cls(32, eps=1e-5).to(dtype)
    with torch.no_grad():
        mod.weight.normal_()
    return mod


def _run(mod, x, g):
    x = x.detach().clone().requires_grad_(True)
    mod.zero_grad(set_to_none=True)
    out = mod(x)
    out.backward(g.to(out.dtype))
    return out, x.grad, mod.weight.grad


@pytest.mark.parametrize("cls", [T5LayerNorm, LlamaRMSNorm])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_equals_hf(cls, dtype):
    ref = _hf(cls, dtype)
    new = RMSNorm.from_hf(copy.deepcopy(ref))
    assert new.cast == ("input" if cls is LlamaRMSNorm else "weight")
    x = torch.randn(3, 5, 32, dtype=dtype) * 3
    g = torch.randn(3, 5, 32, dtype=dtype)
    got, want = _run(new, x, g), _run(ref, x, g)
    fast = type(got[0].grad_fn).__name__ == "_RMSNormBackward"
    assert fast == (dtype == torch.float32)  # float32: the one function; else HF's maths
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)


def test_reuses_the_parameter_and_refuses_bad_input():
    ref = _hf(T5LayerNorm, torch.float32)
    assert RMSNorm.from_hf(ref).weight is ref.weight
    with pytest.raises(SlapoError, match="unknown cast 'nope'"):
        rms_norm(torch.ones(2, 4), torch.ones(4), cast="nope")
    with pytest.raises(SlapoError, match="has no weight/variance_epsilon"):
        RMSNorm.from_hf(torch.nn.LayerNorm(4))


@pytest.mark.parametrize("family,count", [("t5", 12), ("llama", 5)])
def test_recipes_replace_every_rms_norm_with_fuse(family, count):
    sch = apply_schedule(tiny_model(family), family)
    assert sum(type(m) is RMSNorm for m in sch.mod.modules()) == count
    kept = apply_schedule(tiny_model(family), family, fuse=False)
    assert not any(type(m) is RMSNorm for m in kept.mod.modules())
