"""``sync``: autograd-aware collectives around modules, layout rules, chaining, error messages."""

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

import slapo
from slapo import SyncError
from slapo.sharding import check_layouts
from slapo.testing import MLP
from tests.sharding.helpers import spawn_checks, train_and_compare


class ThreeInputs(nn.Module):
    def forward(self, x, y, *, k=1.0):
        return x * y + k


class GatherHead(nn.Module):
    """column-parallel Linear -> all_gather -> replicated Linear."""

    def __init__(self):
        super().__init__()
        self.col = nn.Linear(8, 12)
        self.out = nn.Linear(12, 5)

    def forward(self, x):
        return self.out(torch.tanh(self.col(x)))


def _behaviour():
    rank = dist.get_rank()
    torch.manual_seed(0)
    # fwd_pre keeps the other positional and keyword inputs (reference quirk 9.2 fixed)
    m = ThreeInputs()
    slapo.create_schedule(m).sync("fwd_pre", "all_gather", axis=0)
    full = torch.arange(4.0).view(4, 1)
    x = full[rank * 2:rank * 2 + 2]
    torch.testing.assert_close(m(x, torch.full((4, 1), 2.0), k=3.0), full * 2 + 3)
    torch.testing.assert_close(m(x=x, y=torch.ones(4, 1)), full + 1)  # first input by keyword

    # column-parallel output gathered on the last axis of a 3-D activation (positive axis too)
    for axis in (-1, 2):
        torch.manual_seed(0)
        ref = GatherHead()
        model = copy.deepcopy(ref)
        sch = slapo.create_schedule(model)
        sch["col"].shard(["weight", "bias"], axis=0)
        sch["col"].sync("fwd_post", "all_gather", axis=axis)
        sch["col"].sync("bwd_post", "all_reduce")
        assert check_layouts(sch) == []
        train_and_compare(ref, model, (torch.randn(2, 3, 8),), steps=2)
    clone = copy.deepcopy(model)  # hooks and collectives deep-copy (the group is shared)
    torch.testing.assert_close(clone(torch.ones(2, 3, 8)), model(torch.ones(2, 3, 8)))

    # a positive axis that does not match the layout is caught when the rank is known
    bad = GatherHead()
    bsch = slapo.create_schedule(bad)
    bsch["col"].shard(["weight", "bias"], axis=0)
    bsch["col"].sync("fwd_post", "all_gather", axis=1)
    with pytest.raises(SyncError, match=r"on 'col'.*partitioned on axis 2.*Hint: use axis=-1"):
        bad(torch.randn(2, 4, 8))

    # 'both' around a column-then-row region (bias-free row layer)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16, bias=False))
    model = copy.deepcopy(ref)
    sch = slapo.create_schedule(model)
    sch["0"].shard(["weight", "bias"], axis=0)
    sch["2"].shard("weight", axis=1)
    sch.sync("both", "all_reduce")
    assert check_layouts(sch) == []
    train_and_compare(ref, model, (torch.randn(4, 16),), steps=2)

    # reduce_scatter on a row-parallel Linear with bias: bias added once, after the reduction
    torch.manual_seed(0)
    ref = nn.Linear(8, 6)
    model = copy.deepcopy(ref)
    sch = slapo.create_schedule(model)
    sch.shard("weight", axis=1)
    sch.sync("fwd_post", "reduce_scatter", axis=1)
    calls = []
    sch.sync("fwd_post", lambda mod, inp, out: calls.append(out.shape))  # chained, in order
    x = torch.randn(2, 4, 8)
    ref_y = ref(x)
    y = sch.mod(x[..., rank * 4:rank * 4 + 4])
    torch.testing.assert_close(y, ref_y[:, rank * 2:rank * 2 + 2])
    assert calls == [torch.Size([2, 2, 6])]
    w = torch.randn(2, 4, 6)
    (ref_y * w).sum().backward()
    (y * w[:, rank * 2:rank * 2 + 2]).sum().backward()
    torch.testing.assert_close(sch.mod.weight.grad, ref.weight.grad[:, rank * 4:rank * 4 + 4])
    # the bias gradient is this rank's sequence chunk only (sequence parallelism sums it)
    bias_grad = sch.mod.bias.grad.clone()
    dist.all_reduce(bias_grad)
    torch.testing.assert_close(bias_grad, ref.bias.grad)
    return True




def _errors():
    cases = 0

    def expect(pattern, fn):
        nonlocal cases
        with pytest.raises(SyncError, match=pattern):
            fn()
        cases += 1

    def fresh():
        sch = slapo.create_schedule(MLP(16, 32))
        sch["fc1"].shard(["weight", "bias"], axis=0)
        sch["fc2"].shard("weight", axis=1)
        return sch

    sch = fresh()
    col, row = sch["fc1"], sch["fc2"]
    expect(r"unknown mode 'fwd'", lambda: col.sync("fwd", "all_reduce"))
    expect(r"'allreduce' is not a fwd_post sync op", lambda: col.sync("fwd_post", "allreduce"))
    expect(r"^sync\('fwd_post', 'all_reduce'\) on 'fc1' \(Linear 16->16\): all_reduce needs a "
           r"partial-sum output, but the output is partition\(axis=-1\)\. Hint: gather a "
           r"partitioned output with all_gather\(axis=-1\)\.$",
           lambda: col.sync("fwd_post", "all_reduce"))
    expect(r"all_gather needs a partitioned output, but the output is partial.*all_reduce",
           lambda: row.sync("fwd_post", "all_gather", axis=-1))
    expect(r"along axis -2, but the layout is partitioned on axis -1",
           lambda: col.sync("fwd_post", "all_gather", axis=-2))
    expect(r"reduce_scatter needs a partial-sum output",
           lambda: col.sync("fwd_post", "reduce_scatter", axis=1))
    expect(r"scatter needs a replicated output", lambda: col.sync("fwd_post", "scatter", axis=0))
    expect(r"input must stay partition\(axis=-1\)",
           lambda: row.sync("fwd_pre", "all_gather", axis=-1))
    expect(r"needs a replicated input \(it is column-parallel\)",
           lambda: col.sync("fwd_pre", "scatter", axis=-1))
    expect(r"not a partial sum \(the module is not column-parallel\)",
           lambda: row.sync("bwd_post", "all_reduce"))
    expect(r"a function cannot reduce before the bias",
           lambda: row.sync("fwd_post", lambda m, i, o: o))
    expect(r"only apply to string sync ops", lambda: row.sync("fwd_pre", print, axis=1))
    expect(r"unknown keyword\(s\) dim", lambda: row.sync("fwd_post", "all_reduce", dim=1))
    expect(r"'all_gather' is not a both sync op", lambda: sch.sync("both", "all_gather"))
    col.sync("bwd_post", "all_reduce")
    expect(r"already all-reduced", lambda: col.sync("bwd_post", "all_reduce"))
    row.sync("fwd_post", "all_reduce")
    expect(r"output is replicated.*already complete",
           lambda: row.sync("fwd_post", "all_reduce"))
    expect(r"scatter needs the activation axis.*Hint: pass axis=",
           lambda: slapo.create_schedule(nn.Dropout()).sync("fwd_post", "scatter"))
    conv = slapo.create_schedule(nn.Conv2d(4, 2, 1))
    conv.shard("weight", axis=1)
    expect(r"Conv2d has no bias-after-reduction form", lambda: conv.sync("fwd_post", "all_reduce"))
    drop = slapo.create_schedule(nn.Identity())
    drop.sync("fwd_post", "scatter", axis=0)
    expect(r"3 is not divisible by the tensor-parallel size 2", lambda: drop.mod(torch.ones(3)))
    return cases


@pytest.fixture(scope="module")
def two_ranks():
    """All 2-rank checks of this file in one spawn (a spawn costs seconds)."""
    return spawn_checks([_behaviour, _errors])


def test_sync_behaviour(two_ranks):
    assert two_ranks["_behaviour"] == [True, True]


def test_sync_errors(two_ranks):
    assert two_ranks["_errors"] == [19, 19]  # error cases checked on each rank
