"""Sequence parallelism on top of tensor parallelism (Megatron-style), as schedule helpers.

Between tensor-parallel regions, activations (layer norms, dropout, residual adds) are split
along the *sequence* axis instead of being replicated on every rank:

* enter the sequence-parallel part once: :func:`scatter_sequence` after the embeddings;
* before each column-parallel region: :func:`gather_sequence` after the norm (forward
  all-gather along the sequence, backward reduce-scatter: the gradient from the column-parallel
  layers is partial);
* after each row-parallel layer: :func:`reduce_scatter_sequence` instead of an all-reduce (its
  bias is added after the reduce-scatter, once);
* leave it once: ``gather_sequence(final_norm, tensor_parallel_output_grad=False)`` before a
  replicated LM head (or feed a vocab-parallel head with the default).

Parameters used on a sequence chunk (norm weights, row-parallel biases, embeddings before the
scatter) get only their chunk's gradient on each rank: :func:`mark_replicated` tags them
``replicated_param=True`` (an ``annotate``) and calls the ``all_reduce_grads`` primitive on them,
whose gradient hooks sum each gradient over the TP group *inside backward*: the training loop
needs no call (runtimes: torch, deepspeed, megatron, fsdp). Parameters a user tags
by hand with ``annotate(name, "replicated_param", True)`` get no hook: for those (only) call
:func:`reduce_replicated_grads` after backward; it skips every parameter whose hook already
reduces it, so calling it on a ``mark_replicated`` model is harmless. Dropout on sequence chunks
must differ per rank:
seed with ``slapo.set_random_seed(seed, tp_rank=r, always_enable_tp_seed=True)`` or
``fork_rng()`` those dropout modules.

A GPT-2 block (``h = transformer.h[i]``)::

    gather_sequence(sch[f"{h}.ln_1"]); mark_replicated(sch[f"{h}.ln_1"])
    sch[f"{h}.attn.c_attn"].shard(["weight", "bias"], axis=1, fused=3)
    sch[f"{h}.attn.c_proj"].shard("weight", axis=0)
    reduce_scatter_sequence(sch[f"{h}.attn.c_proj"])
    ... and the same for ln_2 / mlp.c_fc / mlp.c_proj
"""

from __future__ import annotations

from typing import Iterable, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from .collectives import group_size
from .grad_all_reduce import GRAD_ALL_REDUCE_TAG, grad_hook_installed

__all__ = ["scatter_sequence", "gather_sequence", "reduce_scatter_sequence", "mark_replicated",
           "reduce_replicated_grads", "REPLICATED_TAG"]

REPLICATED_TAG = "replicated_param"


def scatter_sequence(sch, axis: int = 1) -> None:
    """Split this module's (replicated) output along the sequence ``axis``."""
    sch.sync("fwd_post", "scatter", axis=axis)


def gather_sequence(sch, axis: int = 1, *, tensor_parallel_output_grad: bool = True) -> None:
    """All-gather this module's sequence-split output along ``axis``. Keep
    ``tensor_parallel_output_grad=True`` when column-parallel layers consume it (their input
    gradient is partial: backward reduce-scatters); pass False before replicated computation."""
    sch.sync("fwd_post", "all_gather", axis=axis,
             tensor_parallel_output_grad=tensor_parallel_output_grad)


def reduce_scatter_sequence(sch, axis: int = 1) -> None:
    """Reduce-scatter the partial output of a row-parallel layer along the sequence ``axis``;
    its bias (if any) is added after the reduction and marked replicated."""
    sch.sync("fwd_post", "reduce_scatter", axis=axis)
    if getattr(sch.mod, "bias", None) is not None:
        mark_replicated(sch, ["bias"])


def mark_replicated(sch, names: Optional[Iterable[str]] = None) -> List[str]:
    """Mark parameters of this module (default: all of them, recursively) replicated across the
    TP ranks but used on a sequence chunk: annotated ``replicated_param=True`` and their
    gradients summed over the TP group in backward by the ``all_reduce_grads`` primitive (both
    recorded in ``sch.history``). Returns the names marked."""
    names = list(names) if names is not None else [n for n, _ in sch.mod.named_parameters()]
    for name in names:
        sch.annotate(name, REPLICATED_TAG, True)
    if names:
        sch.all_reduce_grads(names)
    return names


def _needs_reduction(p: torch.Tensor) -> bool:
    tagged = getattr(p, REPLICATED_TAG, False) or getattr(p, GRAD_ALL_REDUCE_TAG, None)
    return bool(tagged) and p.grad is not None and not grad_hook_installed(p)


def reduce_replicated_grads(model: nn.Module, group: Optional[dist.ProcessGroup] = None) -> int:
    """Sum over ``group`` the gradients of the ``replicated_param`` parameters that no gradient
    hook reduces already (in place, one flattened all-reduce): parameters tagged by hand with
    ``annotate(name, "replicated_param", True)``, or whose ``all_reduce_grads`` hook was lost
    when a runtime re-created them. Those marked by :func:`mark_replicated` / the
    ``all_reduce_grads`` primitive are reduced in backward and skipped, so nothing is reduced
    twice. Call after backward, before the optimizer step. Returns the number of gradients
    reduced."""
    grads = [p.grad for p in model.parameters() if _needs_reduction(p)]
    if not grads or group_size(group) == 1:
        return len(grads)
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    return len(grads)
