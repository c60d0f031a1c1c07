"""slapo.op MLPs: the caller's activation is used, the fused bias+GeLU path matches the eager
one, and the from-HF builders swap into tiny models with identical training steps."""

import pytest
import torch
import torch.nn.functional as F

from slapo.errors import OpError
from slapo.op import MLP, DenseActivation, GatedMLP, mlp_from_hf

from .swap_utils import TOL, check_swap


def _manual(mlp, x, act):
    return mlp.fc_out(act(F.linear(x, mlp.fc_in.weight, mlp.fc_in.bias)))


@pytest.mark.parametrize("activation, fn", [
    ("relu", F.relu), ("gelu", F.gelu), ("gelu_new", lambda t: F.gelu(t, approximate="tanh")),
    ("silu", F.silu), (torch.tanh, torch.tanh), (torch.nn.Sigmoid(), torch.sigmoid),
])
def test_mlp_uses_the_given_activation(activation, fn):
    torch.manual_seed(0)
    mlp = MLP(8, 16, activation)
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(mlp(x), _manual(mlp, x, fn), **TOL)


@pytest.mark.parametrize("compile", [None, "aot_eager"])
@pytest.mark.parametrize("activation", ["gelu", "gelu_new"])
def test_fused_bias_gelu_mlp_matches_unfused(activation, compile):
    torch.manual_seed(0)
    plain = MLP(8, 16, activation)
    fused = MLP(8, 16, activation, fuse_bias_gelu=True, compile=compile)
    fused.load_state_dict(plain.state_dict())  # same parameter names
    x = torch.randn(2, 3, 8, requires_grad=True)
    a, b = plain(x), fused(x)
    torch.testing.assert_close(b, a, **TOL)
    ga = torch.autograd.grad(a.sum(), [x, *plain.parameters()])
    gb = torch.autograd.grad(b.sum(), [x, *fused.parameters()])
    for u, v in zip(ga, gb):
        torch.testing.assert_close(v, u, **TOL)


def test_gated_mlp_and_dropout():
    torch.manual_seed(0)
    g = GatedMLP(8, 16)
    x = torch.randn(2, 3, 8)
    expected = g.down_proj(F.silu(g.gate_proj(x)) * g.up_proj(x))
    torch.testing.assert_close(g(x), expected, **TOL)
    mlp = MLP(8, 16, "relu", dropout=0.5)
    torch.testing.assert_close(mlp.eval()(x), _manual(mlp, x, F.relu), **TOL)
    assert not torch.allclose(mlp.train()(x), _manual(mlp, x, F.relu))


@pytest.mark.parametrize("call, match", [
    (lambda: MLP(4, 8, "swiglu"), "unknown activation"),
    (lambda: MLP(4, 8, "relu", fuse_bias_gelu=True), "needs a GeLU"),
    (lambda: MLP(4, 8, "gelu", bias=False, fuse_bias_gelu=True), "needs a GeLU"),
    (lambda: MLP(4, 8, 3), "name, module or function"),
    (lambda: DenseActivation(4, 8, "relu"), "needs a GeLU"),
    (lambda: mlp_from_hf(torch.nn.Linear(2, 2)), "no slapo MLP builder"),
])
def test_mlp_errors(call, match):
    with pytest.raises(OpError, match=match):
        call()


HF_MLPS = {
    "gpt2": [f"transformer.h.{i}.mlp" for i in range(2)],
    "gpt_neo": [f"transformer.h.{i}.mlp" for i in range(2)],
    "llama": [f"model.layers.{i}.mlp" for i in range(2)],
    "bert": [f"bert.encoder.layer.{i}.intermediate" for i in range(2)],
}


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("family", list(HF_MLPS))
def test_hf_mlp_swap(family, train):
    new = check_swap(family, HF_MLPS[family], mlp_from_hf, train=train)
    expected = {"gpt2": MLP, "gpt_neo": MLP, "llama": GatedMLP, "bert": DenseActivation}
    assert all(type(m) is expected[family] for m in new.values())


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_hf_mlp_swap_fused_bias_gelu(family):
    new = check_swap(family, HF_MLPS[family],
                     lambda m: mlp_from_hf(m, fuse_bias_gelu=True, compile="aot_eager"))
    layer = next(iter(new.values()))
    fc = layer.fc_in if family == "gpt2" else layer.dense
    # GPT-2 uses gelu_new (tanh), BERT the exact erf GeLU: the flavour follows the HF model
    assert fc.approximate == ("tanh" if family == "gpt2" else "none")


def test_hf_mlp_swap_uses_the_model_activation():
    """A ReLU GPT-2 stays ReLU (the original always ran GeLU)."""
    new = check_swap("gpt2", HF_MLPS["gpt2"], mlp_from_hf, activation_function="relu")
    assert all(type(m.act).__name__ == "ReLU" for m in new.values())
    with pytest.raises(OpError, match="needs a GeLU"):
        check_swap("gpt2", HF_MLPS["gpt2"], lambda m: mlp_from_hf(m, fuse_bias_gelu=True),
                   activation_function="relu")
