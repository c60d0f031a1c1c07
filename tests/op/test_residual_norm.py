"""slapo.op.residual_norm: BERT's sub-layer epilogue with the dense bias decomposed and fused
with dropout, the residual add and the LayerNorm equals HF's ``BertSelfOutput``/``BertOutput``
(outputs and gradients, eager and compiled with aot_eager), keeps HF's parameter names but the
bias (recorded as provenance), and refuses other modules."""

import copy

import pytest
import torch

from slapo.errors import OpError
from slapo.op import DenseDropoutResidualNorm, residual_norm_from_hf
from slapo.provenance import provenance_of
from slapo.testing import tiny_model

TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", ["bert.encoder.layer.0.attention.output",
                                  "bert.encoder.layer.1.output"])
@pytest.mark.parametrize("compile", [None, "aot_eager"])
def test_equals_the_hf_epilogue(path, compile):
    hf = tiny_model("bert").get_submodule(path).eval()
    new = residual_norm_from_hf(copy.deepcopy(hf), compile=compile).eval()
    assert isinstance(new, DenseDropoutResidualNorm) and new.dense.bias is None
    assert {n for n, _ in new.named_parameters()} == \
        {"dense.weight", "bias", "LayerNorm.weight", "LayerNorm.bias"}
    assert provenance_of(new)["dense.bias"].params == ("bias",)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, hf.dense.in_features, generator=g, requires_grad=True)
    res = torch.randn(2, 5, hf.dense.out_features, generator=g, requires_grad=True)
    want, got = hf(x, res), new(x, res)
    torch.testing.assert_close(got, want, **TOL)
    want_g = torch.autograd.grad(want.square().sum(), [x, res, hf.dense.weight, hf.dense.bias])
    got_g = torch.autograd.grad(got.square().sum(), [x, res, new.dense.weight, new.bias])
    for a, b in zip(got_g, want_g):
        torch.testing.assert_close(a, b, **TOL)


def test_dropout_only_in_training():
    hf = tiny_model("bert").get_submodule("bert.encoder.layer.0.output")
    new = residual_norm_from_hf(hf)
    new.p = 0.5
    x, res = torch.randn(2, 5, hf.dense.in_features), torch.randn(2, 5, hf.dense.out_features)
    torch.testing.assert_close(new.eval()(x, res), new.eval()(x, res))
    assert not torch.equal(new.train()(x, res), new.eval()(x, res))


def test_other_modules_are_refused():
    with pytest.raises(OpError, match="no fused residual\\+LayerNorm epilogue for Linear"):
        residual_norm_from_hf(torch.nn.Linear(4, 4))
