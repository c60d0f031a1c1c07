"""Expert parallelism for mixture-of-experts layers: tokens travel to the rank holding their expert.

Each of the ``n`` ranks of the group holds ``E / n`` whole experts (experts ``r * E/n`` to
``(r + 1) * E/n - 1`` on rank ``r``). An experts module is called as HF's are,
``experts(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])``, with the same tokens
and routing on every rank (the router is replicated). :class:`ExpertParallelForward`, installed as
a forward wrapper around the experts module's own forward (which then computes only its local
experts), runs one call as:

1. **token shard**: each rank keeps ``1/n`` of the tokens (padded to a multiple of ``n`` with
   tokens routed nowhere); backward all-gathers the input gradients, so every rank gets the whole,
   identical gradient (``split_forward_all_gather_backward``);
2. **dispatch**: each (token, slot) pair is sent to the owner of its expert with one variable-size
   all-to-all (:func:`all_to_all_forward_reverse_all_to_all_backward`);
3. **experts**: the wrapped forward runs the received rows through the local experts (each row
   once, with weight 1), so the model's own expert maths (activation, gating, biases,
   ``experts_implementation``) is used unchanged;
4. **combine**: the results come back by the reverse all-to-all, are weighted by the router's
   weights on the token's own rank (so the weights' gradient stays local) and summed per token;
5. **token gather**: the token shards are all-gathered; the output gradient is replicated, so
   backward keeps this rank's chunk (``all_gather_forward_split_backward``).

Each rank computes the rows routed to its own experts (``1/n`` of all rows when the load is
balanced), the all-to-alls move each row once each way, and the final all-gather is the only
replicated step. The router sees every token on every rank, so its gradient is complete without
a reduction. (Splitting the tokens before the router instead would also split the router's work,
but the MoE block's other consumers of its input -- DeepSeek's shared experts, tensor-parallel
over the same ranks -- need every token on every rank.)
"""

from __future__ import annotations

import copy
from typing import Any, Callable, List, Tuple

import torch
import torch.distributed as dist

from ..errors import SyncError
from .collectives import (Group, all_gather_forward_split_backward, group_rank, group_size,
                          identity_forward_all_reduce_backward, split_forward_all_gather_backward)

__all__ = ["all_to_all_forward_reverse_all_to_all_backward", "exchange_counts",
           "ExpertParallelForward", "RoutedInputGradAllReduce"]


def _all_to_all_rows(x: torch.Tensor, send: List[int], recv: List[int],
                     group: Group) -> torch.Tensor:
    """Rows ``x`` (grouped by destination, ``send[j]`` rows for rank ``j``) exchanged so that this
    rank receives ``recv[j]`` rows from rank ``j``, concatenated in rank order."""
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv,
                           input_split_sizes=send, group=group)
    return out


class _AllToAllRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.sizes, ctx.group = (send, recv), group
        return _all_to_all_rows(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):
        send, recv = ctx.sizes
        return _all_to_all_rows(grad, recv, send, ctx.group), None, None, None


def all_to_all_forward_reverse_all_to_all_backward(x: torch.Tensor, send: List[int],
                                                   recv: List[int],
                                                   group: Group = None) -> torch.Tensor:
    """Send ``send[j]`` rows of ``x`` (in rank order) to rank ``j`` and receive ``recv[j]`` rows
    from it (variable sizes); backward sends the gradient rows back the same way reversed."""
    if group_size(group) == 1:
        return x
    return _AllToAllRows.apply(x, list(send), list(recv), group)


def exchange_counts(send: torch.Tensor, group: Group = None) -> torch.Tensor:
    """``send[j]`` = how many rows this rank sends to rank ``j``; returns how many it receives
    from each rank (one all-to-all of ``n`` integers)."""
    if group_size(group) == 1:
        return send.clone()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send.contiguous(), group=group)
    return recv


def _pad_rows(x: torch.Tensor, rows: int, value: float = 0) -> torch.Tensor:
    if rows == 0:
        return x
    return torch.cat([x, x.new_full((rows, *x.shape[1:]), value)])


class ExpertParallelForward:
    """Forward wrapper of an experts module holding experts ``[first, first + local)`` of
    ``num_experts``: the five steps of the module docstring around ``inner`` (the module's own
    forward over its local experts). Picklable and deep-copyable (the group is shared)."""

    def __init__(self, num_experts: int, group: Group = None):
        self.num_experts, self.group = num_experts, group

    def __deepcopy__(self, memo: dict) -> "ExpertParallelForward":
        new = copy.copy(self)  # the process group is shared, not copied
        memo[id(self)] = new
        return new

    def __call__(self, inner: Callable, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                 top_k_weights: torch.Tensor, *extra, **kwargs) -> torch.Tensor:
        n, group = group_size(self.group), self.group
        if n == 1:
            return inner(hidden_states, top_k_index, top_k_weights, *extra, **kwargs)
        tokens = hidden_states.shape[0]
        pad = (-tokens) % n
        # 1. token shard; padded tokens are routed to the sentinel expert E (sent nowhere)
        h = split_forward_all_gather_backward(_pad_rows(hidden_states, pad), 0, group)
        w = split_forward_all_gather_backward(_pad_rows(top_k_weights, pad), 0, group)
        idx = _pad_rows(top_k_index, pad, self.num_experts).chunk(n)[group_rank(group)]
        # 2. dispatch
        token_of_pair, local_ids, order, send, recv = self._route(idx)
        rows = all_to_all_forward_reverse_all_to_all_backward(h[token_of_pair], send, recv, group)
        ids = self._exchange_ids(local_ids, send, recv)
        # 3. the local experts, each row once with weight 1
        ones = torch.ones(ids.shape[0], 1, dtype=top_k_weights.dtype, device=ids.device)
        out = inner(rows, ids.unsqueeze(1), ones, *extra, **kwargs)
        # 4. combine on the token's own rank
        back = all_to_all_forward_reverse_all_to_all_backward(out, recv, send, group)
        pair_weights = w.reshape(-1)[order].unsqueeze(1)
        weighted = (back * pair_weights).to(h.dtype)
        local = torch.zeros_like(h).index_add(0, token_of_pair, weighted)
        # 5. token gather
        return all_gather_forward_split_backward(local, 0, group)[:tokens]

    def _route(self, idx: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """For this rank's tokens' routing ``idx [t, k]``: the pairs that go to a real expert,
        sorted by owner rank: their token, local expert id at the owner, position among the
        flattened pairs; and the send/receive counts per rank."""
        n = group_size(self.group)
        per_rank = self.num_experts // n
        k = idx.shape[1]
        flat = idx.reshape(-1)
        valid = torch.nonzero(flat < self.num_experts).squeeze(1)
        owner = flat[valid] // per_rank
        owner, perm = torch.sort(owner, stable=True)
        order = valid[perm]
        local_ids = flat[order] - owner * per_rank
        send_t = torch.bincount(owner, minlength=n)
        recv_t = exchange_counts(send_t, self.group)
        return order // k, local_ids, order, send_t.tolist(), recv_t.tolist()

    def _exchange_ids(self, local_ids: torch.Tensor, send: List[int],
                      recv: List[int]) -> torch.Tensor:
        return _all_to_all_rows(local_ids, send, recv, self.group)



class RoutedInputGradAllReduce:
    """Forward-pre hook of a tensor-parallel experts module (every rank holds a slice of every
    expert's intermediate dimension): the gradients of ``hidden_states`` and of
    ``top_k_weights`` are partial sums over the ranks, so both are all-reduced in backward
    (``identity_forward_all_reduce_backward``); the routing indices pass untouched. The experts
    must be called positionally, as HF's MoE blocks do."""

    __name__ = "identity_forward_all_reduce_backward(hidden_states, top_k_weights)"

    def __init__(self, group: Group = None, path: str = ""):
        self.group, self.path = group, path

    def __deepcopy__(self, memo: dict) -> "RoutedInputGradAllReduce":
        new = copy.copy(self)  # the process group is shared, not copied
        memo[id(self)] = new
        return new

    def __call__(self, module: Any, args: tuple) -> tuple:
        if len(args) < 3:
            raise SyncError(
                f"the experts module was called with {len(args)} positional argument(s); its "
                "tensor-parallel form needs (hidden_states, top_k_index, top_k_weights) "
                "positionally", path=self.path, call="shard_experts",
                hint="call the experts as HF's MoE blocks do: experts(hidden, index, weights)")
        hidden, index, weights, *rest = args
        return (identity_forward_all_reduce_backward(hidden, self.group), index,
                identity_forward_all_reduce_backward(weights, self.group), *rest)
