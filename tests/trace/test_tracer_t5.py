"""Tracing through in-place item assignment and data-dependent control flow: a whole
``T5ForConditionalGeneration`` (its ``_shift_right`` writes ``ids[..., 1:] = ...`` and masks
-100s) traces and trains like eager; branches on traced values are guarded; T5 pipeline cuts
over both stacks build stages that train like the HF model."""

import copy
import operator

import pytest
import torch
import torch.fx as fx
from torch import nn

import slapo
from slapo.model_schedule import apply_schedule
from slapo.pipeline import build_pipeline_stages, tied_parameters
from slapo.testing import assert_same_training, example_inputs, tiny_model
from tests.model_schedule.helpers import compare_training


def test_whole_t5_with_labels_traces_and_trains_like_eager():
    ref, model = tiny_model("t5", use_cache=False), tiny_model("t5", use_cache=False)
    sch = slapo.create_schedule(model)
    sch.trace_until(["encoder", "decoder"], example_inputs=example_inputs("t5"))
    assert isinstance(sch.mod, fx.GraphModule)
    assert isinstance(sch["encoder"].mod, fx.GraphModule)
    assert any(n.target is operator.setitem for n in sch.mod.graph.nodes)
    assert list(sch.mod.state_dict()) == list(ref.state_dict())
    assert_same_training(ref, sch.mod, example_inputs("t5"))
    labels = example_inputs("t5", batch=3, seq=6)
    labels["labels"][0, -1] = -100  # shifted in and replaced by the pad id
    assert_same_training(ref, sch.mod, labels)


class Clamp(nn.Module):
    def forward(self, x):
        if (x < 0).any():  # data-dependent branch
            x = x.clamp(min=0)
        assert torch.all(x >= 0).item()
        y = torch.zeros_like(x)
        y[:, 1:] = x[:, :-1] * 2  # in-place item assignment
        return y


def test_data_dependent_branches_are_guarded():
    sch = slapo.create_schedule(nn.Sequential(nn.Identity(), Clamp()))
    gm = sch["1"].trace(example_inputs=(torch.tensor([[1.0, 2.0, 3.0]]),))
    x = torch.tensor([[4.0, 5.0, 6.0], [1.0, 0.5, 0.0]])
    torch.testing.assert_close(gm(x), Clamp()(x))  # the same branch: same result
    with pytest.raises(slapo.TraceError,
                       match=r"condition at .*\(x < 0\).any\(\).* was False when the module "
                             r"was traced but is True.*Hint: re-trace"):
        gm(torch.tensor([[-1.0, 2.0, 3.0]]))


def _chain(stages):
    def forward(**kw):
        out = stages[0](**kw)
        for st in stages[1:]:
            out = st(*out)
        return out
    return forward


def test_t5_pipeline_cuts_in_both_stacks_train_like_hf():
    ref = tiny_model("t5")
    model = copy.deepcopy(ref)
    sch = apply_schedule(model, "t5", pipeline_cuts=[[0], [0]],
                         example_inputs=example_inputs("t5", batch=4))
    stages = build_pipeline_stages(sch)
    assert len(stages) == 3
    # every parameter is in a stage (the tied `shared.weight` under its users' paths)
    assert {id(p) for s in stages for p in s.parameters()} == {id(p) for p in model.parameters()}
    assert {s for s, _ in tied_parameters(stages)[0]} == {0, 1, 2}  # shared embedding, lm_head
    model.forward = _chain(stages)
    assert compare_training(ref, model, example_inputs("t5", batch=3, seq=6)) > 40
