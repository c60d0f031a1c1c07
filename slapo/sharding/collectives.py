"""Autograd-aware collectives for tensor parallelism; each name says forward *and* backward.

====================================================  ===================  ====================
function                                              forward              backward
====================================================  ===================  ====================
``all_reduce_forward_identity_backward``              sum over ranks       identity
``identity_forward_all_reduce_backward``              identity             sum over ranks
``all_gather_forward_split_backward``                 concat along axis    keep own chunk
``all_gather_forward_reduce_scatter_backward``        concat along axis    sum, keep own chunk
``reduce_scatter_forward_all_gather_backward``        sum, keep own chunk  concat
``split_forward_all_gather_backward``                 keep own chunk       concat
``all_to_all_forward_inverse_all_to_all_backward``    move the partition   move it back
====================================================  ===================  ====================

Gather after which every rank computes the same thing (e.g. gathering logits) takes
``..._split_backward``: every rank holds the full, identical gradient. Gather feeding a
column-parallel layer (sequence parallelism) takes ``..._reduce_scatter_backward``: each rank's
gradient is a partial sum. Axes may be negative and any tensor rank works. ``group=None`` is the
default group; without an initialised process group (or with one rank) all are identities.
Runs on gloo (CPU) and NCCL; ``reduce_scatter`` falls back to all-reduce + slice and
``all_to_all`` to all-gather + slice where the backend lacks them.

``all_to_all`` re-partitions a tensor that every rank holds a chunk of along ``from_axis`` so that
it holds a chunk along ``to_axis`` instead (the original's ``"RS->SR"``/``"SR->RS"``): each rank
sends piece ``j`` of its chunk (split along ``to_axis``) to rank ``j`` and concatenates what it
receives along ``from_axis``. Each rank receives ``(n - 1) / n`` of its chunk's size, ``n`` times
less than gather-then-split would; the backward is the same exchange in the other direction.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.distributed as dist

from ..errors import SyncError

__all__ = [
    "all_reduce_forward_identity_backward", "identity_forward_all_reduce_backward",
    "all_gather_forward_split_backward", "all_gather_forward_reduce_scatter_backward",
    "reduce_scatter_forward_all_gather_backward", "split_forward_all_gather_backward",
    "all_to_all_forward_inverse_all_to_all_backward",
    "group_size", "group_rank", "all_reduce", "all_gather", "reduce_scatter", "split",
    "all_to_all",
]

Group = Optional[dist.ProcessGroup]


def group_size(group: Group = None) -> int:
    """World size of ``group`` (1 without torch.distributed)."""
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def group_rank(group: Group = None) -> int:
    """This process's rank in ``group`` (0 without torch.distributed)."""
    return dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0


def _check_divisible(x: torch.Tensor, axis: int, n: int, op: str) -> None:
    if x.shape[axis] % n:
        raise SyncError(
            f"{op} along axis {axis} of a tensor of shape {tuple(x.shape)}: "
            f"{x.shape[axis]} is not divisible by the tensor-parallel size {n}",
            call=op, hint=f"make that dimension a multiple of {n} (e.g. pad the sequence)")


# ---------------------------------------------------------------- raw (non-autograd) ops
def all_reduce(x: torch.Tensor, group: Group = None, op=None) -> torch.Tensor:
    """Sum (or ``op``) of ``x`` over ranks, as a new tensor."""
    if group_size(group) == 1:
        return x
    out = x.clone().contiguous()
    dist.all_reduce(out, op=op or dist.ReduceOp.SUM, group=group)
    return out


def all_gather(x: torch.Tensor, axis: int, group: Group = None) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``axis`` in rank order."""
    n = group_size(group)
    if n == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=axis)


def split(x: torch.Tensor, axis: int, group: Group = None) -> torch.Tensor:
    """This rank's equal chunk of ``x`` along ``axis``."""
    n = group_size(group)
    if n == 1:
        return x
    _check_divisible(x, axis, n, "split")
    return x.chunk(n, dim=axis)[group_rank(group)].contiguous()


def reduce_scatter(x: torch.Tensor, axis: int, group: Group = None) -> torch.Tensor:
    """This rank's chunk along ``axis`` of the sum of ``x`` over ranks."""
    n = group_size(group)
    if n == 1:
        return x
    _check_divisible(x, axis, n, "reduce_scatter")
    chunks = [c.contiguous() for c in x.chunk(n, dim=axis)]
    out = torch.empty_like(chunks[0])
    try:
        dist.reduce_scatter(out, chunks, group=group)
    except (RuntimeError, NotImplementedError):  # backend without reduce_scatter
        return split(all_reduce(x, group), axis, group)
    return out


def all_to_all(x: torch.Tensor, from_axis: int, to_axis: int,
               group: Group = None) -> torch.Tensor:
    """Re-partition ``x`` (this rank's chunk along ``from_axis``) into this rank's chunk along
    ``to_axis`` of the same global tensor."""
    n = group_size(group)
    if n == 1 or from_axis == to_axis:
        return x
    _check_divisible(x, to_axis, n, "all_to_all")
    sends = [c.contiguous() for c in x.chunk(n, dim=to_axis)]
    recvs = [torch.empty_like(sends[0]) for _ in range(n)]
    try:
        dist.all_to_all(recvs, sends, group=group)
    except (RuntimeError, NotImplementedError):  # backend without all_to_all
        return split(all_gather(x, from_axis, group), to_axis, group)
    return torch.cat(recvs, dim=from_axis)


# ---------------------------------------------------------------- autograd functions
class _AllReduceIdentity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _IdentityAllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group), None


class _GatherSplit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, group):
        ctx.axis, ctx.group = axis, group
        return all_gather(x, axis, group)

    @staticmethod
    def backward(ctx, grad):
        return split(grad, ctx.axis, ctx.group), None, None


class _GatherReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, group):
        ctx.axis, ctx.group = axis, group
        return all_gather(x, axis, group)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter(grad, ctx.axis, ctx.group), None, None


class _ReduceScatterGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, group):
        ctx.axis, ctx.group = axis, group
        return reduce_scatter(x, axis, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, ctx.axis, ctx.group), None, None


class _SplitGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axis, group):
        ctx.axis, ctx.group = axis, group
        return split(x, axis, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, ctx.axis, ctx.group), None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, from_axis, to_axis, group):
        ctx.axes, ctx.group = (from_axis, to_axis), group
        return all_to_all(x, from_axis, to_axis, group)

    @staticmethod
    def backward(ctx, grad):
        from_axis, to_axis = ctx.axes
        return all_to_all(grad, to_axis, from_axis, ctx.group), None, None, None


def _axis(x: torch.Tensor, axis: int) -> Tuple[torch.Tensor, int]:
    if not -x.dim() <= axis < x.dim():
        raise SyncError(f"axis {axis} is out of range for a {x.dim()}-D activation of shape "
                        f"{tuple(x.shape)}", hint="pass an axis of the activation, e.g. axis=-1")
    return x, axis % x.dim()


def all_reduce_forward_identity_backward(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    """Sum a partial activation over ranks; its gradient is already replicated."""
    return _AllReduceIdentity.apply(x, group)


def identity_forward_all_reduce_backward(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    """Pass ``x`` on; sum its gradient over ranks (entering a column-parallel region)."""
    return _IdentityAllReduce.apply(x, group)


def all_gather_forward_split_backward(x: torch.Tensor, axis: int,
                                      group: Group = None) -> torch.Tensor:
    """Gather along ``axis``; the (replicated) gradient is split back to this rank's chunk."""
    return _GatherSplit.apply(*_axis(x, axis), group)


def all_gather_forward_reduce_scatter_backward(x: torch.Tensor, axis: int,
                                               group: Group = None) -> torch.Tensor:
    """Gather along ``axis``; the (partial) gradient is summed and split (reduce-scatter)."""
    return _GatherReduceScatter.apply(*_axis(x, axis), group)


def reduce_scatter_forward_all_gather_backward(x: torch.Tensor, axis: int,
                                               group: Group = None) -> torch.Tensor:
    """Sum a partial activation and keep this rank's chunk along ``axis``; gather the gradient."""
    return _ReduceScatterGather.apply(*_axis(x, axis), group)


def split_forward_all_gather_backward(x: torch.Tensor, axis: int,
                                      group: Group = None) -> torch.Tensor:
    """Keep this rank's chunk of a replicated activation along ``axis``; gather the gradient."""
    return _SplitGather.apply(*_axis(x, axis), group)


def all_to_all_forward_inverse_all_to_all_backward(x: torch.Tensor, from_axis: int, to_axis: int,
                                                   group: Group = None) -> torch.Tensor:
    """Move the partition of ``x`` from ``from_axis`` to ``to_axis`` with one all-to-all; the
    gradient (partitioned along ``to_axis``) is moved back to ``from_axis`` the same way."""
    x, from_axis = _axis(x, from_axis)
    return _AllToAll.apply(x, from_axis, _axis(x, to_axis)[1], group)
