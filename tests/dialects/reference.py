"""A tiny GPT-2, per-rank batches and the single-process reference every dialect must match
(notes/platform.md §9b: different batch per rank, compared with one process on the union; SGD so
that several steps stay comparable in fp32)."""

from __future__ import annotations

from typing import Dict, List

import torch
import torch.distributed as dist

import slapo
from slapo.testing import example_inputs, tiny_model

STEPS = 3


def sgd(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1)


def gpt():
    return tiny_model("gpt2", use_cache=False)


def rank_batch(rank: int) -> Dict[str, torch.Tensor]:
    return example_inputs("gpt2", batch=2, seq=8, seed=rank)


def union_batch(world: int) -> Dict[str, torch.Tensor]:
    parts = [rank_batch(r) for r in range(world)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def train(model, opt, batch, steps: int = STEPS) -> List[float]:
    """Plain loop; the loss is averaged over all ranks when torch.distributed is initialised."""
    losses = []
    for _ in range(steps):
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.detach().clone()
        if dist.is_initialized():
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        losses.append(loss.item())
    return losses


def reference_losses(world: int = 2, steps: int = STEPS) -> List[float]:
    """The ``torch`` target in one process on the union of the ranks' batches."""
    model, opt = slapo.build(slapo.create_schedule(gpt()), optimizer=sgd)
    return train(model, opt, union_batch(world), steps)


def tp_schedule_gpt2(sch) -> None:
    """Megatron-style tensor parallelism of the tiny GPT-2 (column-parallel qkv / fc, row-parallel
    projections) on the schedule's group."""
    for i in range(2):
        h = f"transformer.h.{i}"
        sch[f"{h}.attn.c_attn"].shard(["weight", "bias"], axis=1, fused=3)
        sch[f"{h}.attn.c_attn"].sync("bwd_post", "all_reduce")
        sch[f"{h}.mlp.c_fc"].shard(["weight", "bias"], axis=1)
        sch[f"{h}.mlp.c_fc"].sync("bwd_post", "all_reduce")
        for proj in (f"{h}.attn.c_proj", f"{h}.mlp.c_proj"):
            sch[proj].shard("weight", axis=0)
            sch[proj].sync("fwd_post", "all_reduce")
