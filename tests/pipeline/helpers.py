"""Shared by the pipeline tests: train this rank's stage through ``PipelineRunner`` next to the
unpipelined reference and compare the loss and every local gradient at each step."""

from typing import List, Optional, Sequence

import torch
from torch import nn

from slapo.pipeline import PipelineRunner
from slapo.testing import example_inputs


def train_stage_like_reference(ref: nn.Module, stages: Sequence[nn.Module], family: str,
                               schedule: str, steps: int) -> List[Optional[float]]:
    """``steps`` SGD steps of ``ref`` and of this rank's stage (2 micro-batches of 2); returns
    the pipeline's loss per step (``None`` on ranks without the last stage)."""
    import torch.distributed as dist

    rank = dist.get_rank()
    runner = PipelineRunner(stages, n_microbatches=2, schedule=schedule)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(stages[rank].parameters(), lr=0.1)
    losses: List[Optional[float]] = []
    for step in range(steps):
        inputs = example_inputs(family, batch=4, seq=8, seed=step)
        ref_opt.zero_grad()
        ref_loss = ref(**inputs).loss
        ref_loss.backward()
        opt.zero_grad()
        loss = runner.step(inputs)
        if loss is not None:
            torch.testing.assert_close(loss, ref_loss.detach())
        ref_params = dict(ref.named_parameters(remove_duplicate=False))
        for name, p in stages[rank].named_parameters():
            torch.testing.assert_close(p.grad, ref_params[name].grad, msg=name, atol=1e-5,
                                       rtol=1e-4)
        losses.append(None if loss is None else float(loss))
        ref_opt.step()
        opt.step()
    return losses
