"""All-to-all resharding: move a partition from one activation axis to another with one
collective (the original's ``"RS->SR"`` / ``"SR->RS"``), forward and backward.

Checked on 1 and 2 gloo ranks: the collective against gather-then-split (values and gradients),
and a schedule that column-shards ``fc1``, moves its output to a sequence partition for an
element-wise op, moves it back before the row-sharded ``fc2``, against the unscheduled model.
"""

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

import slapo
from slapo import SyncError
from slapo.sharding import (
    all_gather_forward_split_backward,
    all_to_all_forward_inverse_all_to_all_backward,
    check_layouts,
    split_forward_all_gather_backward,
)
from slapo.testing import run_distributed
from tests.sharding.helpers import train_and_compare


class Mixer(nn.Module):
    """fc1 -> element-wise op -> fc2, on ``[batch, seq, hidden]`` activations."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)) * 2.0)


def _collective_vs_gather_then_split():
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    full = torch.randn(2, 4, 6, 8)
    upstream = torch.randn_like(full)  # gradient arriving at the resharded tensor
    for src, dst in ((-1, -2), (-2, -1), (1, 3), (-3, -1)):
        local = full.chunk(n, dim=src)[rank].clone().requires_grad_()
        base = full.chunk(n, dim=src)[rank].clone().requires_grad_()
        out = all_to_all_forward_inverse_all_to_all_backward(local, src, dst)
        want = split_forward_all_gather_backward(
            all_gather_forward_split_backward(base, src), dst)
        torch.testing.assert_close(out, want)
        torch.testing.assert_close(out, full.chunk(n, dim=dst)[rank])
        grad = upstream.chunk(n, dim=dst)[rank]
        out.backward(grad)
        want.backward(grad)
        torch.testing.assert_close(local.grad, base.grad)
        torch.testing.assert_close(local.grad, upstream.chunk(n, dim=src)[rank])
    return n


def _schedule(model: nn.Module, n: int):
    sch = slapo.create_schedule(model)
    sch["fc1"].shard(["weight", "bias"], axis=0)
    sch["fc1"].sync("bwd_post", "all_reduce")
    sch["fc1"].sync("fwd_post", "all_to_all", axis=-2)  # RS -> SR: from_axis from the layout
    sch["fc2"].shard("weight", axis=1)
    sch["fc2"].sync("fwd_pre", "all_to_all", from_axis=-2)  # SR -> RS: axis from the layout
    sch["fc2"].sync("fwd_post", "all_reduce")
    return sch


def _mixer_vs_unscheduled():
    n = dist.get_world_size()
    torch.manual_seed(0)
    ref = Mixer()
    model = copy.deepcopy(ref)
    sch = _schedule(model, n)
    assert check_layouts(sch) == []
    names = [h.op.name for h in model.fc1._forward_hooks.values()]
    assert "all_to_all_forward_inverse_all_to_all_backward" in names
    torch.manual_seed(1)
    x = torch.randn(2, 4, 8)
    train_and_compare(ref, model, (x,), steps=2)
    # a sequence not divisible by the ranks is refused at run time, naming the fix
    if n > 1:
        with pytest.raises(SyncError, match="not divisible by the tensor-parallel size"):
            model(torch.randn(2, 3, 8))
    return n


def _checks():
    return _collective_vs_gather_then_split(), _mixer_vs_unscheduled()


@pytest.mark.parametrize("world_size", [1, 2])
def test_all_to_all_matches_gather_then_split_and_unscheduled(world_size):
    assert run_distributed(_checks, world_size) == [(world_size, world_size)] * world_size


def _layout_errors():
    errors = {}
    sch = slapo.create_schedule(Mixer())
    sch["fc1"].shard(["weight", "bias"], axis=0)
    sch["fc2"].shard("weight", axis=1)
    for key, node, args, kwargs in [
        ("partial", "fc2", ("fwd_post", "all_to_all"), {"axis": -2}),
        ("wrong_from", "fc1", ("fwd_post", "all_to_all"), {"from_axis": -2, "axis": -3}),
        ("same_axis", "fc1", ("fwd_post", "all_to_all"), {"axis": -1}),
        ("wrong_to", "fc2", ("fwd_pre", "all_to_all"), {"from_axis": -2, "axis": -2}),
        ("column_input", "fc1", ("fwd_pre", "all_to_all"), {"from_axis": -2, "axis": -1}),
    ]:
        with pytest.raises(SyncError) as info:
            sch[node].sync(*args, **kwargs)
        errors[key] = str(info.value)
    return errors


def test_layout_rules_know_all_to_all():
    errors = run_distributed(_layout_errors, 2)[0]
    assert "the output is partial" in errors["partial"]
    assert "Hint: use from_axis=-1" in errors["wrong_from"]
    assert "does nothing" in errors["same_axis"]
    assert "Hint: use axis=-1" in errors["wrong_to"]
    assert "not row-parallel" in errors["column_input"]


def test_unsharded_module_needs_both_axes():
    sch = slapo.create_schedule(Mixer())
    with pytest.raises(SyncError, match="all_to_all needs from_axis.*Hint: pass from_axis="):
        sch["act"].sync("fwd_post", "all_to_all", axis=-2)
    with pytest.raises(SyncError, match="from_axis only applies to all_to_all"):
        sch["act"].sync("fwd_post", "scatter", axis=-2, from_axis=-1)


@pytest.mark.parametrize("spec,hint", [
    ("RS->SR", "sync('fwd_post', 'all_to_all', from_axis=-1, axis=-2)"),
    ("SR->RS", "sync('fwd_post', 'all_to_all', from_axis=-2, axis=-1)"),
    ("RS->RR", "sync('fwd_post', 'all_gather', axis=-1)"),
    ("SR->RR", "sync('fwd_post', 'all_gather', axis=-2)"),
    ("RR->RS", "sync('fwd_post', 'scatter', axis=-1)"),
    ("RR->SR", "sync('fwd_post', 'scatter', axis=-2)"),
    ("RS->RS", "does nothing"),
    ("SS->RR", "RR, RS and SR"),
])
def test_resharding_strings_name_the_collective(spec, hint):
    sch = slapo.create_schedule(Mixer())
    with pytest.raises(SyncError, match="not sync ops") as info:
        sch["act"].sync("fwd_post", spec)
    assert "Hint: " + ("write " if spec in ("RS->SR",) else "") in str(info.value)
    assert hint in str(info.value).split("Hint:")[1]
