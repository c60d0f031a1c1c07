"""What ``verify`` will hold at its peak, estimated before it runs, and the check that stops it
with a one-line error instead of running into the out-of-memory killer.

Per rank ``verify`` holds: a materialised copy of the original (every parameter, full size),
the scheduled module's own (sharded) parameters, a copy of those to restore afterwards (not for
a meta model, which is put back on meta), copies made by broadcasts and gathers, gradients
of both models when it runs backward (``check_grads`` or ``steps > 1``), and the activations
of both models. Weights are counted
exactly from the parameter shapes (meta or real); activations are estimated from a
transformer's config (hidden size, layers, heads, FFN, vocabulary; tokens from the inputs), or
left out for a model without one. Outputs are compared a chunk at a time and module outputs only
on a mismatch (then the original's are held for one more run), so neither adds to the peak.
Measured against this estimate: ``scripts/bench_verify_memory.py`` (docs/verify.md).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist
from torch import nn

from ..errors import VerifyError

__all__ = ["Estimate", "estimate_peak", "check_memory"]

_GIB = 2 ** 30


@dataclasses.dataclass
class Estimate:
    """Estimated peak bytes of ``verify`` on one rank, and what they are made of."""

    parts: Dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def __str__(self) -> str:
        shown = ", ".join(f"{k} {v / _GIB:.1f}" for k, v in self.parts.items() if v)
        return f"{self.total / _GIB:.1f} GiB ({shown})"


def _bytes(module: nn.Module, dtype: Optional[torch.dtype]) -> int:
    total = 0
    for t in list(module.parameters()) + list(module.buffers()):
        size = (torch.empty((), dtype=dtype).element_size()
                if dtype is not None and t.is_floating_point() else t.element_size())
        total += t.numel() * size
    return total


def _first(config: Any, *names: str, default: int = 0) -> int:
    for n in names:
        v = getattr(config, n, None)
        if isinstance(v, int) and v > 0:
            return v
    return default


def _tokens(inputs: Any) -> tuple:
    """``(tokens, sequence length)`` of the first tensor input: ids ``[batch, seq]`` or hidden
    states ``[batch, seq, hidden]``."""
    args, kwargs = inputs
    for t in list(args) + list(kwargs.values()):
        if isinstance(t, torch.Tensor) and t.dim() >= 2:
            shape = t.shape if not t.is_floating_point() else t.shape[:-1]
            return int(torch.Size(shape).numel()), int(shape[-1])
    return 0, 0


def _activations(config: Any, inputs: Any, whole: bool, backward: bool, elem: int) -> int:
    """Activations of both models at the peak, from a transformer's config (0 without one)."""
    hidden = _first(config, "hidden_size", "n_embd", "d_model")
    tokens, seq = _tokens(inputs)
    if not hidden or not tokens:
        return 0
    layers = _first(config, "num_hidden_layers", "n_layer", "num_layers", default=1) \
        if whole else 1
    heads = _first(config, "num_attention_heads", "n_head", "num_heads", default=1)
    ffn = _first(config, "intermediate_size", "n_inner", "ffn_dim", "d_ff", default=4 * hidden)
    vocab = _first(config, "vocab_size") if whole else 0
    logits = tokens * vocab * elem
    # saved for backward per layer: ~10 hidden-sized tensors and 2 FFN-sized (SDPA, the
    # default attention, keeps no [heads, seq, seq] probabilities; eager attention does, and
    # is then under-counted)
    layer_saved = tokens * (10 * hidden + 2 * ffn) * elem
    layer_live = tokens * (4 * hidden + 2 * ffn + 2 * heads * seq) * elem
    if backward:  # every layer's saved tensors, in both models, plus the logits and the loss's
        return 2 * (layers * layer_saved + 2 * logits)
    return 2 * logits + logits + layer_live  # both outputs, a loss temporary, one layer


def estimate_peak(reference: nn.Module, scheduled: nn.Module, inputs: Any, *, whole: bool,
                  backward: bool, dtype: Optional[torch.dtype] = None,
                  config: Any = None) -> Estimate:
    """The estimated peak of one rank's ``verify`` of ``scheduled`` against ``reference``
    (``whole``: the root model, else a sub-module; ``backward``: gradients are computed)."""
    ref = _bytes(reference, dtype)
    mine = _bytes(scheduled, dtype)
    meta = any(t.is_meta for t in scheduled.parameters())
    elem = (torch.empty((), dtype=dtype).element_size() if dtype is not None else
            next((p.element_size() for p in reference.parameters() if p.is_floating_point()), 4))
    largest = max((t.numel() * elem for t in reference.parameters()), default=0)
    parts = {"original": ref, "scheduled": mine, "restore copy": 0 if meta else mine,
             "transfers": 2 * largest,  # a broadcast's copy, a gathered shard
             "gradients": ref + mine if backward else 0,
             "activations": _activations(config if config is not None
                                         else getattr(reference, "config", None),
                                         inputs, whole, backward, elem)}
    # materialising, loading shards and the allocator keeping freed blocks: measured at +20%
    # to +25% of the above for BERT (scripts/bench_verify_memory.py, docs/verify.md)
    parts["allocator margin"] = sum(parts.values()) // 4
    return Estimate(parts)


def _available(device: Any) -> tuple:
    """``(bytes available to this rank, ranks sharing them)``: the accelerator's free memory
    for a CUDA device, else the host's available memory shared by the ranks on this host."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.mem_get_info(dev)[0], 1
    import psutil

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or (
        dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1)
    return psutil.virtual_memory().available, local


def check_memory(estimate: Estimate, device: Any, group: Any, sub_module: bool) -> None:
    """Raise :class:`VerifyError` (on every rank alike) when the estimate exceeds the memory
    available; the message says how much is needed and which options lower it."""
    avail, sharing = _available(device)
    need = torch.tensor([float(estimate.total * sharing), -float(avail)], dtype=torch.float64)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(need, op=dist.ReduceOp.MAX, group=group)
    total, free = need[0].item(), -need[1].item()
    if total <= free:
        return
    ranks = f" x {sharing} ranks on this machine" if sharing > 1 else ""
    raise VerifyError(
        f"verify would need about {total / _GIB:.1f} GiB: {estimate} per rank{ranks}, but "
        f"only {free / _GIB:.1f} GiB are available", call="verify",
        hint="lower it with check_grads=False and steps=1 (forward only), a smaller batch or "
        "sequence, fewer layers" + ("" if sub_module else " or one layer at a time "
                                    "(slapo.verify(sch['...layer.0'], ...))")
        + ", float32 instead of dtype=torch.float64; check_memory=False skips this check")
