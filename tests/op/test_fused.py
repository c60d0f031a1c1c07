"""slapo.op fused ops: eager references, the lazily compiled path (aot_eager, cheap on CPU),
dropout only in training, the Linear variant, and argument errors."""

import copy

import pytest
import torch
import torch.nn.functional as F

from slapo.errors import OpError
from slapo.op import (
    FusedBiasDropoutResidual,
    FusedBiasGeLU,
    LinearBiasGeLU,
    bias_dropout_residual,
    bias_dropout_residual_layer_norm,
    bias_dropout_residual_layer_norm_reference,
    bias_gelu,
    bias_gelu_reference,
)
from slapo.op.fused import LazyCompiled

TOL = dict(atol=1e-5, rtol=1e-5)


def _inputs(*shapes):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=g).requires_grad_() for s in shapes]


def _check(fn_a, fn_b, tensors):
    out_a = fn_a(*tensors)
    grads_a = torch.autograd.grad(out_a.square().sum(), tensors)
    out_b = fn_b(*tensors)
    grads_b = torch.autograd.grad(out_b.square().sum(), tensors)
    torch.testing.assert_close(out_a, out_b, **TOL)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("compile", [None, "aot_eager"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu(approximate, compile):
    x, b = _inputs((3, 5, 8), (8,))
    _check(lambda x, b: bias_gelu(x, b, approximate, compile=compile),
           lambda x, b: F.gelu(x + b, approximate=approximate), [x, b])
    # the two flavours really differ (the original always ran tanh; reference-spec 9.11)
    assert not torch.allclose(bias_gelu_reference(x, b, "none"), bias_gelu_reference(x, b, "tanh"))


@pytest.mark.parametrize("compile", [None, "aot_eager"])
def test_bias_dropout_residual_layer_norm_without_dropout(compile):
    x, b, r, w, lb = _inputs((2, 4, 8), (8,), (2, 4, 8), (8,), (8,))
    _check(lambda *t: bias_dropout_residual_layer_norm(*t[:3], 0.3, False, *t[3:], 1e-6,
                                                       compile=compile),
           lambda x, b, r, w, lb: F.layer_norm(r + x + b, (8,), w, lb, 1e-6), [x, b, r, w, lb])
    _check(lambda x, b, r: bias_dropout_residual(x, b, r, 0.0, True, compile=compile),
           lambda x, b, r: r + x + b, [x, b, r])


def test_dropout_statistics_in_training():
    x = torch.ones(200, 100)
    torch.manual_seed(0)
    y = bias_dropout_residual(x, None, None, 0.25, True)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.02
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.75))
    assert torch.equal(bias_dropout_residual(x, None, None, 0.25, False), x)


def test_modules_dropout_only_in_training():
    x, b, r = (t.detach() for t in _inputs((4, 16), (16,), (4, 16)))
    mod = FusedBiasDropoutResidual(p=0.5, normalized_shape=16, eps=1e-6)
    ln = mod.layer_norm
    clean = bias_dropout_residual_layer_norm_reference(x, b, r, 0.0, False, ln.weight, ln.bias,
                                                       1e-6)
    torch.testing.assert_close(mod.eval()(x, b, r), clean)
    assert not torch.allclose(mod.train()(x, b, r), clean)
    plain = FusedBiasDropoutResidual(p=0.5).eval()
    torch.testing.assert_close(plain(x, b, r), r + x + b)
    gelu = FusedBiasGeLU("tanh", compile="aot_eager")
    torch.testing.assert_close(gelu(x, b), F.gelu(x + b, approximate="tanh"), **TOL)


def test_linear_bias_gelu_is_a_linear():
    torch.manual_seed(0)
    lin = LinearBiasGeLU(8, 12, "none")
    assert isinstance(lin, torch.nn.Linear)
    assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]
    x = _inputs((3, 8))[0]
    _check(lin, lambda x: F.gelu(F.linear(x, lin.weight, lin.bias)), [x])
    calls = []
    lin.register_forward_hook(lambda *a: calls.append(1))  # hooks fire: the module is called
    lin(x)
    assert calls


def test_lazy_compile_copies_start_fresh():
    lazy = LazyCompiled(bias_gelu_reference, "aot_eager")
    x, b = (t.detach() for t in _inputs((2, 4), (4,)))
    lazy(x, b)
    assert lazy._compiled is not None
    clone = copy.deepcopy(lazy)
    assert clone._compiled is None and clone.backend == "aot_eager"


@pytest.mark.parametrize("call, match", [
    (lambda: bias_gelu(torch.ones(2), torch.ones(2), "erf"), "unknown GeLU approximation"),
    (lambda: bias_dropout_residual(torch.ones(2), None, None, 1.5, True), "outside"),
    (lambda: bias_gelu(torch.ones(2), torch.ones(2), compile=3), "torch.compile backend"),
    (lambda: FusedBiasDropoutResidual(0.1, 4)(torch.ones(4), None, None), "needs a residual"),
    (lambda: LinearBiasGeLU(2, 2, "fast"), "unknown GeLU approximation"),
])
def test_fused_errors(call, match):
    with pytest.raises(OpError, match=match):
        call()
