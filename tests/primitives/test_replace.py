import pytest
import torch
from torch import nn

import slapo
from slapo.testing import MLP, assert_same_training, example_inputs, tiny_model


class RMSNorm(nn.Module):
    """An independent RMSNorm, to replace LLaMA's."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.eps = eps

    def forward(self, hidden_states):
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(hidden_states.dtype)


def _replacements(family, model):
    """(path, new module) pairs that are numerically equivalent to the original."""
    if family == "bert":
        return [(f"bert.encoder.layer.{i}.intermediate.intermediate_act_fn", nn.GELU())
                for i in range(2)]
    if family == "gpt2":
        return [(f"transformer.h.{i}.mlp.act", nn.GELU(approximate="tanh")) for i in range(2)]
    if family == "llama":
        out = []
        for i in range(2):
            norm = model.model.layers[i].input_layernorm
            out.append((f"model.layers.{i}.input_layernorm",
                        RMSNorm(norm.weight, norm.variance_epsilon)))
            out.append((f"model.layers.{i}.mlp.act_fn", nn.SiLU()))
        return out
    raise AssertionError(family)


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_replace_keeps_numerics(family):
    ref = tiny_model(family)
    model = tiny_model(family)
    sch = slapo.create_schedule(model)
    for path, new in _replacements(family, model):
        old = sch[path].mod
        sch[path].replace(new)
        assert sch[path].mod is new and sch[path].path == path
        assert model.get_submodule(path) is new and old is not new
    built, opt = slapo.build(sch)
    assert built is model and opt is None
    assert_same_training(ref, built, example_inputs(family), atol=1e-5, rtol=1e-5)


def test_replace_moves_hooks_and_keeps_handles():
    model = MLP()
    calls = []
    handle = model.fc1.register_forward_hook(lambda m, i, o: calls.append("post"))
    model.fc1.register_forward_pre_hook(lambda m, i: calls.append("pre"))
    sch = slapo.create_schedule(model)
    new = nn.Linear(16, 32)
    sch["fc1"].replace(new)
    model(torch.randn(2, 16))
    assert calls == ["pre", "post"]
    handle.remove()  # the old handle still controls the moved hook
    calls.clear()
    model(torch.randn(2, 16))
    assert calls == ["pre"]


def test_replace_with_wrapper_keeps_child_metadata():
    model = MLP()
    sch = slapo.create_schedule(model)
    sch["fc1"].metadata["note"] = "kept"
    inner = model.fc1
    sch["fc1"].replace(nn.Sequential(inner), check_signature=False)
    assert sch["fc1.0"].mod is inner
    assert sch["fc1.0"].metadata["note"] == "kept"
    assert sch["fc1"].metadata["replace"] == ["Linear -> Sequential"]


def test_replace_root():
    sch = slapo.create_schedule(MLP())
    new = MLP()
    sch.replace(new)
    assert sch.mod is new and "fc1" in sch and sch["fc1"].mod is new.fc1


class TwoInputs(nn.Module):
    def forward(self, x, y):
        return x + y


def test_replace_rejects_non_module():
    sch = slapo.create_schedule(MLP())
    with pytest.raises(slapo.ReplaceError, match=r"on 'fc1' \(Linear 16->32\).*expected an "
                       r"nn.Module.*Hint: wrap the function"):
        sch["fc1"].replace(torch.relu)


def test_replace_rejects_same_module():
    sch = slapo.create_schedule(MLP())
    with pytest.raises(slapo.ReplaceError, match="already at this path"):
        sch["fc1"].replace(sch["fc1"].mod)


def test_replace_rejects_mismatched_signature():
    sch = slapo.create_schedule(MLP())
    with pytest.raises(slapo.ReplaceError, match="requires argument.*y.*Hint"):
        sch["fc1"].replace(TwoInputs())


def test_replace_rejects_missing_keyword_parameters():
    sch = slapo.create_schedule(tiny_model("bert"))

    class OnlyHidden(nn.Module):
        def forward(self, hidden_states):
            return (hidden_states,)

    with pytest.raises(slapo.ReplaceError, match="does not accept argument.*attention_mask"):
        sch["bert.encoder.layer.0.attention"].replace(OnlyHidden())
    # the escape hatch
    sch["bert.encoder.layer.0.attention"].replace(OnlyHidden(), check_signature=False)


def test_replace_rejects_too_few_positional():
    sch = slapo.create_schedule(nn.Sequential(TwoInputs()))

    class One(nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(slapo.ReplaceError, match="2 required positional"):
        sch["0"].replace(One())


def test_replace_name_without_subgraph_is_an_error():
    sch = slapo.create_schedule(MLP())
    with pytest.raises(slapo.ReplaceError, match="only apply when replacing a subgraph"):
        sch["fc1"].replace(nn.Linear(16, 32), name="x")


def test_replace_all_gelu_in_gpt2():
    from transformers.activations import NewGELUActivation

    ref = tiny_model("gpt2")
    model = tiny_model("gpt2")
    sch = slapo.create_schedule(model)
    done = sch.replace_all(NewGELUActivation, lambda path, old: nn.GELU(approximate="tanh"))
    assert done == ["transformer.h.0.mlp.act", "transformer.h.1.mlp.act"]
    assert not any(isinstance(m, NewGELUActivation) for m in model.modules())
    assert_same_training(ref, model, example_inputs("gpt2"), atol=1e-5, rtol=1e-5)


def test_replace_all_does_not_recurse_and_passes_kwargs():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.ModuleList([nn.Linear(4, 4)]))
    sch = slapo.create_schedule(model)
    seen = []

    def wrap(path, old, tag):
        seen.append((path, tag))
        return nn.Sequential(old, nn.Identity())

    done = sch.replace_all(nn.Linear, wrap, tag="t")
    assert done == ["0", "2.0"] and seen == [("0", "t"), ("2.0", "t")]
    assert isinstance(model[0][0], nn.Linear) and isinstance(model[2][0][0], nn.Linear)


def test_replace_all_errors():
    sch = slapo.create_schedule(MLP())
    with pytest.raises(slapo.ReplaceError, match="no submodule of type Conv2d"):
        sch.replace_all(nn.Conv2d, lambda p, m: m)
    with pytest.raises(slapo.ReplaceError, match="must be an nn.Module class"):
        sch.replace_all(int, lambda p, m: m)
    with pytest.raises(slapo.ReplaceError, match="not callable"):
        sch.replace_all(nn.Linear, None)
    with pytest.raises(slapo.ReplaceError, match="returned int for 'fc1'"):
        sch.replace_all(nn.Linear, lambda p, m: 3)
