import pytest
import torch

import slapo
from slapo.testing import MLP, tiny_model


def test_build_returns_module_and_optimizer():
    sch = slapo.create_schedule(MLP())
    model, opt = slapo.build(sch, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    assert model is sch.mod and isinstance(opt, torch.optim.SGD)
    before = model.fc1.weight.detach().clone()
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    assert not torch.equal(before, model.fc1.weight)


def test_build_errors():
    sch = slapo.create_schedule(MLP())
    with pytest.raises(slapo.BuildError, match="unknown build target 'nope'.*'torch'"):
        slapo.build(sch, target="nope")
    with pytest.raises(slapo.BuildError, match="does not take option.*config"):
        slapo.build(sch, config={})
    with pytest.raises(slapo.BuildError, match="expected a Schedule"):
        slapo.build(MLP())
    with pytest.raises(slapo.BuildError, match="factory"):
        slapo.build(sch, optimizer=3)


def test_meta_model_needs_init_weights():
    with slapo.init_empty_weights():
        model = MLP()
    assert model.fc1.weight.is_meta
    sch = slapo.create_schedule(model)
    with pytest.raises(slapo.InitError, match="meta device.*Hint: pass init_weights"):
        slapo.build(sch)
    built, _ = slapo.build(sch, init_weights=True)
    assert not built.fc1.weight.is_meta and built.fc1.weight.abs().sum() > 0


def test_build_init_weights_callable_on_hf_model():
    with slapo.init_empty_weights():
        model = tiny_model("gpt2")
    sch = slapo.create_schedule(model)
    calls = []

    def init(mod):
        calls.append(type(mod).__name__)
        for p in mod.parameters(recurse=False):
            torch.nn.init.constant_(p, 0.5)

    built, _ = slapo.build(sch, init_weights=init)
    assert "Embedding" in calls
    assert all((p == 0.5).all() for p in built.parameters())
