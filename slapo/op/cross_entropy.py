"""Vocab-parallel cross-entropy: the loss over logits split on the vocabulary axis.

With a column-parallel LM head each rank holds logits for vocab rows ``[r*V/p, (r+1)*V/p)``.
Gathering the full ``[tokens, V]`` logits to compute the loss costs memory and bandwidth; this op
computes the exact same loss with three small all-reduces over ``[tokens]`` vectors: the max
logit (for stability), the target logit (held by one rank) and the sum of exponentials (plus the
logit sum when label smoothing is on). Its backward is written out (``softmax - target
distribution``), so no full-vocab tensor is ever built.

Usable from schedules: shard the LM head on axis 0 (no ``all_gather`` after it) and compute the
loss with :func:`vocab_parallel_cross_entropy`, or set ``model.loss_function =
VocabParallelCausalLMLoss()`` on a HuggingFace causal LM.

What it keeps for the backward pass: by default the fp32 softmax (``[tokens, V/p]``), as
Megatron-LM's vocab-parallel cross-entropy does, and the forward and backward each build one or
two more fp32 tensors of that size. ``lean=True`` keeps only the logits (already in memory, in
their own dtype) and one log-sum-exp per token, and works through the vocabulary a block of
rows at a time (:data:`LEAN_BLOCK_ELEMENTS` fp32 elements), writing the gradient straight into
the logits' dtype: no full-vocabulary fp32 tensor exists, as in fused cross-entropy kernels
(flash-attn's ``CrossEntropyLoss``, which llm-foundry trains MPT with). Same loss and gradient.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from ..errors import SlapoError
from ..sharding.collectives import all_reduce, group_rank, group_size

__all__ = ["vocab_parallel_cross_entropy", "VocabParallelCrossEntropy",
           "VocabParallelCausalLMLoss", "VocabParallelMaskedLMLoss", "LEAN_BLOCK_ELEMENTS",
           "WHOLE_VOCAB"]


class _WholeVocab:
    """``group=WHOLE_VOCAB``: this rank holds the whole vocabulary (no collectives), also in a
    distributed run (``group=None`` means the world)."""

    def __repr__(self) -> str:
        return "WHOLE_VOCAB"


WHOLE_VOCAB: Any = _WholeVocab()


def _size(group) -> int:
    return 1 if group is WHOLE_VOCAB else group_size(group)


def _rank(group) -> int:
    return 0 if group is WHOLE_VOCAB else group_rank(group)


def _all_reduce(x: torch.Tensor, group, op=None) -> torch.Tensor:
    return x if group is WHOLE_VOCAB else all_reduce(x, group, op=op)


#: fp32 elements of one block of rows in the ``lean`` cross-entropy (256 MiB): large enough
#: that a block is a few big kernels, small beside a full-vocabulary tensor
LEAN_BLOCK_ELEMENTS = 1 << 26


def _blocks(rows: int, vocab: int):
    step = max(1, LEAN_BLOCK_ELEMENTS // max(1, vocab))
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


def _upcast(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()


class _LeanVocabParallelCE(torch.autograd.Function):
    """:class:`_VocabParallelCE`'s loss and gradient, keeping the logits and a log-sum-exp per
    row instead of the softmax (module docstring, ``lean``)."""

    @staticmethod
    def forward(ctx, logits, target, group, ignore_index, smoothing):
        v_local = logits.shape[-1]
        v_total = v_local * _size(group)
        start = _rank(group) * v_local
        blocks = _blocks(logits.shape[0], v_local)
        # the row max is exact in the logits' dtype: no upcast copy needed for it
        row_max = _all_reduce(_upcast(logits.max(dim=-1).values), group, op=dist.ReduceOp.MAX)
        local_t = target - start
        valid = target != ignore_index
        mine = valid & (local_t >= 0) & (local_t < v_local)
        local_t = local_t.clamp(0, v_local - 1)
        target_logit = _upcast(logits.gather(-1, local_t.unsqueeze(-1)).squeeze(-1)) * mine
        sum_exp = torch.cat([(_upcast(logits[b]) - row_max[b].unsqueeze(-1)).exp_().sum(dim=-1)
                             for b in blocks])
        sum_exp = _all_reduce(sum_exp, group)
        log_z = row_max + sum_exp.log()
        target_logit = _all_reduce(target_logit, group)
        loss = log_z - target_logit
        if smoothing > 0:
            logit_sum = torch.cat([_upcast(logits[b]).sum(dim=-1) for b in blocks])
            mean_logit = _all_reduce(logit_sum, group) / v_total
            loss = (1 - smoothing) * loss + smoothing * (log_z - mean_logit)
        ctx.save_for_backward(logits, log_z, local_t, mine, valid)
        ctx.smoothing, ctx.v_total = smoothing, v_total
        return loss * valid

    @staticmethod
    def backward(ctx, grad_loss):
        logits, log_z, local_t, mine, valid = ctx.saved_tensors
        grad = torch.empty_like(logits)
        scale = grad_loss * valid
        for b in _blocks(logits.shape[0], logits.shape[-1]):
            block = (_upcast(logits[b]) - log_z[b].unsqueeze(-1)).exp_()  # softmax
            rows = torch.arange(block.shape[0], device=block.device)
            block[rows, local_t[b]] -= (1 - ctx.smoothing) * mine[b].to(block.dtype)
            if ctx.smoothing > 0:
                block -= ctx.smoothing / ctx.v_total
            grad[b] = block.mul_(scale[b].unsqueeze(-1))
        return grad, None, None, None, None


class _VocabParallelCE(torch.autograd.Function):
    """Per-token loss from ``[N, V_local]`` logits and ``[N]`` global target ids."""

    @staticmethod
    def forward(ctx, logits, target, group, ignore_index, smoothing):
        x = logits if logits.dtype == torch.float64 else logits.float()  # low precision up
        v_local = x.shape[-1]
        v_total = v_local * _size(group)
        start = _rank(group) * v_local
        x = x - _all_reduce(x.max(dim=-1).values, group, op=dist.ReduceOp.MAX).unsqueeze(-1)
        local_t = target - start
        valid = target != ignore_index
        mine = valid & (local_t >= 0) & (local_t < v_local)
        local_t = local_t.clamp(0, v_local - 1)
        target_logit = x.gather(-1, local_t.unsqueeze(-1)).squeeze(-1) * mine
        target_logit = _all_reduce(target_logit, group)
        exp = x.exp()
        sum_exp = _all_reduce(exp.sum(dim=-1), group)
        log_z = sum_exp.log()
        loss = log_z - target_logit
        if smoothing > 0:
            mean_logit = _all_reduce(x.sum(dim=-1), group) / v_total
            loss = (1 - smoothing) * loss + smoothing * (log_z - mean_logit)
        loss = loss * valid
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local_t, mine, valid)
        ctx.smoothing, ctx.v_total, ctx.dtype = smoothing, v_total, logits.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        probs, local_t, mine, valid = ctx.saved_tensors
        grad = probs.clone()
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, local_t] -= (1 - ctx.smoothing) * mine.to(grad.dtype)
        if ctx.smoothing > 0:
            grad -= ctx.smoothing / ctx.v_total
        grad *= (grad_loss * valid).unsqueeze(-1)
        return grad.to(ctx.dtype), None, None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    group: Optional[dist.ProcessGroup] = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    lean: bool = False,
) -> torch.Tensor:
    """Cross-entropy of ``logits`` (``[..., V/p]``, this rank's vocab chunk, rank order along
    the vocabulary) against global ``target`` ids (``[...]``); equals ``F.cross_entropy`` on the
    full logits. Targets equal to ``ignore_index`` contribute nothing (``mean`` averages over
    the others). With one rank (or no process group, or ``group=WHOLE_VOCAB``: logits of the
    whole vocabulary on every rank) it is plain cross-entropy. ``lean``: keep no
    full-vocabulary fp32 tensor (module docstring).

    Raises:
        SlapoError: shapes do not match, or an unknown ``reduction`` / bad ``label_smoothing``.
    """
    call = "vocab_parallel_cross_entropy"
    if logits.shape[:-1] != target.shape:
        raise SlapoError(f"logits of shape {tuple(logits.shape)} do not match targets of shape "
                         f"{tuple(target.shape)}", call=call,
                         hint="logits are [..., vocab/p] and targets [...] (flatten both)")
    if reduction not in ("mean", "sum", "none"):
        raise SlapoError(f"unknown reduction {reduction!r}", call=call,
                         hint="use 'mean', 'sum' or 'none'")
    if not 0.0 <= label_smoothing < 1.0:
        raise SlapoError(f"label_smoothing must be in [0, 1), got {label_smoothing}", call=call,
                         hint="e.g. label_smoothing=0.1")
    op = _LeanVocabParallelCE if lean else _VocabParallelCE
    flat = op.apply(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), group,
                    ignore_index, float(label_smoothing))
    if reduction == "none":
        return flat.view(target.shape)
    if reduction == "sum":
        return flat.sum()
    return flat.sum() / (target != ignore_index).sum().clamp(min=1)


class VocabParallelCrossEntropy(nn.Module):
    """Module form of :func:`vocab_parallel_cross_entropy`."""

    def __init__(self, group: Optional[dist.ProcessGroup] = None, ignore_index: int = -100,
                 label_smoothing: float = 0.0, reduction: str = "mean", lean: bool = False):
        super().__init__()
        self.group, self.ignore_index = group, ignore_index
        self.label_smoothing, self.reduction, self.lean = label_smoothing, reduction, lean

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(
            logits, target, group=self.group, ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing, reduction=self.reduction, lean=self.lean)


class VocabParallelCausalLMLoss:
    """Drop-in for a HuggingFace causal LM's ``loss_function`` when its LM head is
    vocab-parallel: ``model.loss_function = VocabParallelCausalLMLoss()``. Shifts the labels
    like HF's ``ForCausalLMLoss`` and ignores HF's (global) ``vocab_size`` argument. A tracing
    leaf (``_slapo_leaf``): a traced forward calls it as one node (its collectives and autograd
    function cannot be traced; :mod:`slapo.trace.leaf_calls`). ``lean``: the memory-lean
    computation (module docstring); with ``group=WHOLE_VOCAB`` (logits of the whole vocabulary)
    it is a memory-lean drop-in for HF's own loss."""

    _slapo_leaf = True

    def __init__(self, group: Optional[dist.ProcessGroup] = None, lean: bool = False):
        self.group, self.lean = group, lean

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, vocab_size: int = 0,
                 num_items_in_batch: Optional[torch.Tensor] = None, ignore_index: int = -100,
                 shift_labels: Optional[torch.Tensor] = None, **kwargs: Any) -> torch.Tensor:
        if shift_labels is None:
            labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:]
        reduction = "sum" if num_items_in_batch is not None else "mean"
        loss = vocab_parallel_cross_entropy(logits, shift_labels.to(logits.device),
                                            group=self.group, ignore_index=ignore_index,
                                            reduction=reduction, lean=self.lean)
        if num_items_in_batch is not None:
            loss = loss / num_items_in_batch
        return loss

    def __deepcopy__(self, memo: dict) -> "VocabParallelCausalLMLoss":
        return self  # holds only a process group handle


class VocabParallelMaskedLMLoss(VocabParallelCausalLMLoss):
    """Drop-in for a HuggingFace model's ``loss_function`` when transformers resolves it to
    ``ForMaskedLMLoss`` (masked LMs such as EuroBERT; T5Gemma's seq2seq heads, whose decoder
    inputs are already shifted) and the LM head is vocab-parallel: the labels align with the
    logits (no shift); otherwise as :class:`VocabParallelCausalLMLoss`."""

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor, vocab_size: int = 0,
                 num_items_in_batch: Optional[torch.Tensor] = None, ignore_index: int = -100,
                 shift_labels: Optional[torch.Tensor] = None, **kwargs: Any) -> torch.Tensor:
        return super().__call__(logits, labels, vocab_size, num_items_in_batch, ignore_index,
                                shift_labels=labels, **kwargs)
