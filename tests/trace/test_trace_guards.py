"""What a trace fixes is exact or refused (issue #39): the mode (``self.training``), numbers taken
from traced values (``int(x.shape[0])``, ``len(x)``), grad mode and autocast queries. Refusals
are one line naming what changed; schedules on a mode-merged graph (find + replace) stay exact in
both modes."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import slapo
from slapo.testing import assert_same_training, example_inputs, tiny_model
from slapo.trace.modes import TracedModeError


class Inner(nn.Module):
    def forward(self, x):
        if self.training:  # an operation only in training mode
            x = x.sin()
        return F.dropout(x, 0.5, training=self.training)  # an argument that differs


class Numbers(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.inner = Inner()

    def forward(self, x):
        b, n = int(x.shape[0]), len(x)
        h = self.fc(x).view(b, -1) * n
        return self.inner(h) * 2 if torch.is_grad_enabled() else self.inner(h)


class Top(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Numbers()

    def forward(self, x):
        return self.block(x)


def _pair():
    torch.manual_seed(0)
    ref, model = Top(), Top()
    model.load_state_dict(ref.state_dict())
    return ref, model


def _refusal(model, x, match, error=slapo.TraceError):
    with pytest.raises(error, match=match) as e:
        model(x)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("traced_training", [True, False])
def test_structural_mode_difference_is_refused_unless_the_brancher_is_a_leaf(traced_training):
    x = torch.randn(2, 3, 4)
    ref, model = _pair()
    model.train(traced_training)
    slapo.create_schedule(model)["block"].trace(example_inputs=(x,), flatten=True)
    ref.train(traced_training)
    assert_same_training(ref, model, (x,))
    model.train(not traced_training)
    traced = "training" if traced_training else "evaluation"
    _refusal(model, x, rf"'block' was traced in {traced} mode.*make 'block.inner'.*a leaf",
             TracedModeError)
    # the module that branches on self.training as a leaf: exact in both modes
    ref, model = _pair()
    model.train(traced_training)
    slapo.create_schedule(model)["block"].trace(example_inputs=(x,), flatten=True,
                                                leaves=["inner"])
    for training in (True, False):
        ref.train(training)
        model.train(training)
        assert_same_training(ref, model, (x,))


def test_numbers_and_grad_mode_fixed_at_trace_time_are_guarded():
    x = torch.randn(2, 3, 4)
    ref, model = _pair()
    slapo.create_schedule(model)["block"].trace(example_inputs=(x,), leaves=["inner"])
    assert_same_training(ref, model, (x,))
    _refusal(model, torch.randn(3, 3, 4), r"number at .*int\(x.shape\[0\]\).* was 2 .* is 3")
    with torch.no_grad():
        _refusal(model, x, r"read torch.is_grad_enabled\(\) = True when it was traced")


def test_find_and_replace_on_a_mode_merged_graph_are_exact_in_both_modes():
    path = "bert.encoder.layer.0.attention.self"
    over = dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    ref, model = tiny_model("bert", **over), tiny_model("bert", **over)
    sch = slapo.create_schedule(model)
    sch[path].trace(recursive=False, flatten=True, example_inputs=example_inputs("bert"))
    assert "by_mode" in sch[path].mod.code
    found = sch[path].find(r"(query|key|value)$")
    sch[path].replace(Fused(*[sch[path].mod.get_submodule(n) for n in ("query", "key",
                                                                         "value")]), found)
    for training in (True, False, True):
        ref.train(training)
        model.train(training)
        assert_same_training(ref, model, example_inputs("bert", batch=3, seq=5),
                             ignore=[f"{path}.{n}.{p}" for n in ("query", "key", "value")
                                     for p in ("weight", "bias")])


class Fused(nn.Module):
    """q, k and v from one matmul (the same values as the three linears)."""

    def __init__(self, *linears):
        super().__init__()
        self.weight = nn.Parameter(torch.cat([m.weight.detach() for m in linears]))
        self.bias = nn.Parameter(torch.cat([m.bias.detach() for m in linears]))

    def forward(self, x):
        return tuple(F.linear(x, self.weight, self.bias).chunk(3, dim=-1))
