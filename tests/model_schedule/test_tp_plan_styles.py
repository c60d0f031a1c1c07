"""The plan styles one by one (``slapo.model_schedule.tp_plan.styles``): every HF style string is
honoured or refused, twin strings are one style, and each style applied to a tiny module trains
like the unscheduled module (outputs and every gradient) on 1 and 2 gloo ranks."""

import copy

import pytest
import torch
from torch import nn

from slapo import create_schedule
from slapo.errors import ConfigError
from slapo.model_schedule.common import TPMode
from slapo.model_schedule.config import ScheduleConfig
from slapo.model_schedule.tp_plan import (REFUSED, STYLES, Colwise, Embedding, Replicate,
                                          Rowwise, apply_plan, check_styles, resolve_plan)
from slapo.testing import run_distributed
from tests.model_schedule.helpers import compare_training


def test_every_hf_style_string_is_honoured_or_refused():
    """HF's tensor-parallel styles (the registry also holds, once their module is imported, the
    expert-parallel styles of ``base_model_ep_plan``, which Slapo does not read)."""
    import transformers.distributed.tensor_parallel as hf_tp

    registry = hf_tp.ALL_PARALLEL_STYLES
    hf = {k for k in registry.valid_keys() if type(registry[k]).__module__ == hf_tp.__name__}
    assert {"colwise", "rowwise", "moe_tp_experts"} <= hf
    assert hf - set(STYLES) - set(REFUSED) == set(), "a new HF style: map it or refuse it"
    assert not set(STYLES) & set(REFUSED)
    assert set(STYLES) | set(REFUSED) <= set(registry.valid_keys())


def test_twin_strings_are_one_style_and_parameters_make_the_style():
    assert STYLES["colwise_rep"] == STYLES["colwise_gather_output"] == Colwise(gather_output=True)
    assert STYLES["rowwise_rep"] == STYLES["rowwise_split_input"] == Rowwise(split_input=True)
    assert STYLES["replicate"] == STYLES["local_params"] == Replicate()
    assert STYLES["packed_colwise"] == Colwise(packed=True) != Colwise()
    assert STYLES["embedding_colwise"] == Embedding(axis=1)
    assert Colwise() != Rowwise()


def test_refused_and_unknown_styles_are_one_line_errors():
    model = _Tiny()
    for style, match in (("sequence_parallel", "use the sequence_parallel knob"),
                         ("colwise_sideways", "unknown style 'colwise_sideways'.*close: colwise")):
        entries = resolve_plan(model, {"blk.up": style})
        with pytest.raises(ConfigError, match=match) as err:
            check_styles(entries)
        assert "\n" not in str(err.value) and "'blk.up: " in str(err.value)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)       # 4 heads of 4, a per-head norm, back down
        self.norm = nn.LayerNorm(4)
        self.down = nn.Linear(16, 8)
        self.gu = nn.Linear(8, 16)       # packed gate|up read packed by dn
        self.dn = nn.Linear(16, 8)
        self.a = nn.Linear(8, 8)         # whole output, whole input
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        h = self.norm(self.up(x).unflatten(-1, (-1, 4))).flatten(-2)
        x = x + self.down(torch.relu(h))
        x = x + self.dn(torch.relu(self.gu(x)))
        return x + self.b(torch.tanh(self.a(x)))


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(16, 8)
        self.pos = nn.Embedding(16, 8)
        self.blk = _Block()
        self.keep = nn.Linear(8, 8)

    def forward(self, ids):
        out = self.keep(self.blk(self.emb(ids) + self.pos(ids)))
        return {"out": out, "loss": (out ** 2).mean()}


PLAN = {"emb": "embedding_rowwise", "pos": "embedding_colwise", "blk.up": "colwise",
        "blk.norm": "replicated_with_grad_allreduce", "blk.down": "rowwise",
        "blk.gu": "packed_colwise", "blk.dn": "packed_rowwise", "blk.a": "colwise_gather_output",
        "blk.b": "rowwise_split_input", "keep": "replicate"}
TWINS = dict(PLAN, **{"blk.a": "colwise_rep", "blk.b": "rowwise_rep", "keep": "local_params"})


def _check_plans():
    """Each plan applied to a fresh tiny module gives the reference's outputs and gradients;
    returns how many parameters each rank holds per plan."""
    import torch.distributed as dist

    ws = dist.get_world_size() if dist.is_initialized() else 1
    held = []
    for plan in (PLAN, TWINS):
        ref = _Tiny()
        model = copy.deepcopy(ref)
        sch = create_schedule(model)
        apply_plan(sch, resolve_plan(model, plan), ScheduleConfig(), TPMode(tp=ws > 1))
        ids = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(0))
        assert compare_training(ref, sch.mod, {"ids": ids}) == len(list(ref.parameters()))
        held.append(sum(p.numel() for p in sch.mod.parameters()))
    return held


def test_styles_train_like_the_unscheduled_module_on_one_rank():
    whole = sum(p.numel() for p in _Tiny().parameters())
    assert _check_plans() == [whole, whole]


def test_styles_train_like_the_unscheduled_module_on_two_ranks():
    whole = sum(p.numel() for p in _Tiny().parameters())
    held = run_distributed(_check_plans, 2, timeout=240)
    assert held[0] == held[1] and held[0][0] == held[0][1] < whole
