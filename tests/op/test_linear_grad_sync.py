"""LinearWithGradSync: a column-parallel Linear / Conv1D whose input gradient is all-reduced
asynchronously while the weight gradient is computed. Numerics against the unsharded layer on 1
and 2 gloo ranks, the overlap itself (the all-reduce is started before, and waited for after,
the weight-gradient GEMM), autocast, deepcopy, and ``sync('bwd_post', ...)`` swapping it in."""

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from transformers.pytorch_utils import Conv1D

import slapo
from slapo.op.linear import LinearWithGradSync
from slapo.testing import run_distributed


def _layer(kind: str, bias: bool) -> nn.Module:
    torch.manual_seed(0)
    if kind == "linear":
        return nn.Linear(6, 8, bias=bias).double()
    mod = Conv1D(8, 6).double()  # HF Conv1D: weight [in, out], always a bias
    nn.init.normal_(mod.weight)
    nn.init.normal_(mod.bias)
    return mod


def _grads(mod: nn.Module, x: torch.Tensor, weight_of_out: torch.Tensor):
    mod.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    out = mod(x)
    (out * weight_of_out).sum().backward()
    grads = {n: p.grad for n, p in mod.named_parameters()}
    return out.detach(), x.grad, grads


@pytest.mark.parametrize("kind,bias", [("linear", True), ("linear", False), ("conv1d", True)])
def test_one_rank_equals_the_layer(kind, bias):
    ref = _layer(kind, bias)
    new = LinearWithGradSync.from_module(ref)
    assert new.weight is ref.weight and new.bias is ref.bias  # the same Parameters
    x = torch.randn(3, 5, 6, dtype=torch.float64)
    w = torch.randn(3, 5, 8, dtype=torch.float64)
    want, got = _grads(ref, x, w), _grads(new, x, w)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name])


def test_input_without_grad_and_frozen_weight():
    ref = _layer("linear", True)
    new = LinearWithGradSync.from_module(ref)
    ref.weight.requires_grad_(False)
    x = torch.randn(4, 6, dtype=torch.float64)  # no grad wanted for the input
    new(x).sum().backward()
    assert ref.weight.grad is None
    torch.testing.assert_close(ref.bias.grad, torch.full((8,), 4.0, dtype=torch.float64))


def test_autocast_matches_linear_under_autocast():
    ref = _layer("linear", True).float()
    new = LinearWithGradSync.from_module(copy.deepcopy(ref))
    x = torch.randn(4, 6)
    results = []
    for mod in (ref, new):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = mod(xi)
        out.float().sum().backward()
        results.append((out, xi.grad, mod.weight.grad, mod.bias.grad))
    assert results[1][0].dtype == results[0][0].dtype == torch.bfloat16
    for got, want in zip(results[1], results[0]):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


def test_deepcopy_shares_the_process_group_and_copies_parameters():
    group = object()  # any handle: a ProcessGroup cannot be copied
    new = LinearWithGradSync(nn.Parameter(torch.ones(2, 3)), None, group)
    twin = copy.deepcopy(new)
    assert twin.group is group and twin.weight is not new.weight
    assert torch.equal(twin.weight, new.weight)


def _column_parallel(kind: str):
    """Each rank holds half the output features; the input gradients are summed over ranks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ref = _layer(kind, True)
    shard = copy.deepcopy(ref)
    axis = 1 if kind == "conv1d" else 0
    with torch.no_grad():
        shard.weight = nn.Parameter(ref.weight.chunk(world, axis)[rank].clone())
        shard.bias = nn.Parameter(ref.bias.chunk(world, 0)[rank].clone())
    new = LinearWithGradSync.from_module(shard, None)
    calls = []
    real = dist.all_reduce

    def spy(tensor, *args, **kwargs):  # records how the real all-reduce is called
        calls.append(kwargs.get("async_op", False))
        return real(tensor, *args, **kwargs)

    torch.manual_seed(1)
    x = torch.randn(3, 5, 6, dtype=torch.float64)
    w = torch.randn(3, 5, 8, dtype=torch.float64)
    want = _grads(ref, x, w)
    dist.all_reduce = spy
    try:
        got = _grads(new, x, w.chunk(world, -1)[rank])
    finally:
        dist.all_reduce = real
    torch.testing.assert_close(got[0], want[0].chunk(world, -1)[rank])
    torch.testing.assert_close(got[1], want[1])  # the full input gradient on every rank
    torch.testing.assert_close(got[2]["weight"], want[2]["weight"].chunk(world, axis)[rank])
    torch.testing.assert_close(got[2]["bias"], want[2]["bias"].chunk(world, 0)[rank])
    return calls


@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_two_ranks_column_parallel_sums_the_input_gradient_asynchronously(kind):
    for calls in run_distributed(_column_parallel, 2, kind):
        assert calls == [True]  # exactly one all-reduce, started with async_op=True


def _overlap_order():
    """The all-reduce is started before the weight-gradient GEMM and waited for after it."""
    events = []
    real_all_reduce, real_mm = dist.all_reduce, torch.Tensor.mm

    class Handle:
        def __init__(self, inner):
            self.inner = inner

        def wait(self):
            events.append("wait")
            return self.inner.wait()

    def all_reduce(tensor, *args, **kwargs):
        events.append("all_reduce")
        return Handle(real_all_reduce(tensor, *args, **kwargs))

    def mm(self, other):
        events.append("mm")
        return real_mm(self, other)

    new = LinearWithGradSync(nn.Parameter(torch.randn(4, 6)), None, None)
    x = torch.randn(5, 6, requires_grad=True)
    out = new(x)
    dist.all_reduce, torch.Tensor.mm = all_reduce, mm
    try:
        out.sum().backward()
    finally:
        dist.all_reduce, torch.Tensor.mm = real_all_reduce, real_mm
    return events


def test_two_ranks_the_all_reduce_overlaps_the_weight_gradient():
    for events in run_distributed(_overlap_order, 2):
        assert events == ["all_reduce", "mm", "wait"]


def _sync_swaps_it_in():
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 6)).double()
    ref = copy.deepcopy(model)
    sch = slapo.create_schedule(model)
    sch["0"].shard(["weight", "bias"], axis=0)
    sch["0"].sync("bwd_post", "all_reduce")
    sch["2"].shard("weight", axis=1)
    sch["2"].sync("fwd_post", "all_reduce")
    assert type(sch["0"].mod) is LinearWithGradSync
    torch.manual_seed(2)
    x = torch.randn(4, 6, dtype=torch.float64)
    slapo.verify(sch, [x], reference=ref, dtype=torch.float64)  # outputs and every gradient
    built, _ = slapo.build(sch)
    return [n for n, _ in built.named_parameters()], [n for n, _ in ref.named_parameters()]


def test_sync_bwd_post_on_a_linear_swaps_it_in_and_verifies():
    for got, want in run_distributed(_sync_swaps_it_in, 2):
        assert got == want  # same parameter names
