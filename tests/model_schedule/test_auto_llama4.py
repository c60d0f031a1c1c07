"""Llama 4's dense-routed experts (``slapo.model_schedule.moe_dense``) under the auto schedule:
tensor parallelism inside the experts and expert parallelism, against the unscheduled model on
1 and 2 gloo ranks (outputs, every gradient incl. the router's and the shared expert's, 3 SGD
steps, the fraction of parameters the plan shards, replicas equal), ``verify`` on the sharded
experts, and the probe that refuses a one-input experts module of another form."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from slapo.testing import run_distributed
from tests.model_schedule.test_auto_families import check_families

CASES = ("llama4_text", ("llama4_text", {"expert_parallel": True}), "llama4")


def test_llama4_auto_one_rank():
    results = check_families(CASES)
    assert all(r == "ok" for r in results.values()), results


def _sharded_and_verified():
    """Llama 4 Maverick's layout (dense MLP layers interleaved with MoE ones, the plan's
    ``feed_forward.*_proj`` entries for the former): each rank holds half of every expert
    tensor (either form), and ``slapo.verify`` maps them to the unscheduled model's (outputs
    and every gradient)."""
    import slapo
    from slapo.model_schedule import apply_schedule
    from slapo.testing.models import tiny_plan_model

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    ref = tiny_plan_model("llama4_text", num_hidden_layers=4, interleave_moe_layer_step=2)
    assert [hasattr(layer.feed_forward, "experts") for layer in ref.model.layers] == [
        False, True, False, True]
    experts = ref.model.layers[1].feed_forward.experts
    ids = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    for expert_parallel, axes in ((False, (2, 1)), (True, (0, 0))):
        sch = apply_schedule(copy.deepcopy(ref), "auto", expert_parallel=expert_parallel)
        local = sch.mod.model.layers[1].feed_forward.experts
        for name, axis in zip(("gate_up_proj", "down_proj"), axes):
            assert getattr(local, name).shape[axis] * 2 == getattr(experts, name).shape[axis]
        report = slapo.verify(sch, {"input_ids": ids, "labels": ids}, reference=ref)
        assert report.ok, report.failures()
    return "ok"


def test_llama4_auto_tp2():
    results = run_distributed(check_families, 2, CASES, timeout=600)
    for rank, result in enumerate(results):
        assert all(r == "ok" for r in result.values()), (rank, result)
    assert run_distributed(_sharded_and_verified, 2, timeout=300) == ["ok", "ok"]


class _UngatedExperts(nn.Module):
    """One input, Llama 4's tensor shapes, but ``relu(x_e @ gate_up_e[..., :I]) @ down_e``:
    not the gated form, so the split the dense path makes is not checked for it."""

    def __init__(self, num: int = 4, hidden: int = 8, inter: int = 4):
        super().__init__()
        self.hidden_size = hidden
        self.gate_up_proj = nn.Parameter(torch.randn(num, hidden, 2 * inter))
        self.down_proj = nn.Parameter(torch.randn(num, inter, hidden))
        self.act_fn = nn.ReLU()

    def forward(self, hidden_states):
        x = hidden_states.view(self.gate_up_proj.shape[0], -1, self.hidden_size)
        inter = self.down_proj.shape[1]
        return torch.bmm(self.act_fn(torch.bmm(x, self.gate_up_proj[..., :inter])),
                         self.down_proj).view(-1, self.hidden_size)


def test_dense_routed_layout_and_probe():
    """The layout comes from the shapes (also when hidden == intermediate, Llama 4's tiny
    config); a one-input module of another form is refused by the probe, unchanged."""
    from slapo.errors import ConfigError
    from slapo.model_schedule import moe_dense
    from slapo.model_schedule.moe import ExpertsLayout
    from slapo.testing.models import tiny_plan_model

    warnings.filterwarnings("ignore")
    experts = tiny_plan_model("llama4_text").model.layers[0].feed_forward.experts
    layout = ExpertsLayout.of(experts, "e")
    assert layout.dense and layout.transposed and layout.axes == {"gate_up_proj": 2,
                                                                  "down_proj": 1}
    moe_dense.check_dense_form("e", experts, transposed=True)
    odd = _UngatedExperts()
    before = [p.detach().clone() for p in odd.parameters()]
    assert moe_dense.dense_routed(odd) and ExpertsLayout.of(odd, "e").transposed
    with pytest.raises(ConfigError, match=r"_UngatedExperts is called with one input but its "
                       r"forward on a probe is not the per-expert gated MLP"):
        moe_dense.check_dense_form("e", odd, transposed=True)
    assert all(torch.equal(a, b) for a, b in zip(before, odd.parameters()))
