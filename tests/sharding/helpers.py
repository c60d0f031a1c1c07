"""Shared checks for tensor-parallel tests: compare a sharded model with its unsharded reference.

A sharded parameter's value/gradient is compared with ``spec.slice_of(reference)`` on each rank
(equivalent to gathering every rank's shard and comparing with the full tensor).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn

from slapo.sharding import get_shard_spec, reduce_replicated_grads
from slapo.testing import run_distributed
from slapo.testing.compare import outputs_of, scalar_loss

TOL = dict(rtol=1e-5, atol=1e-5)


def assert_params_close(model: nn.Module, ref: nn.Module, *, grads: bool, **tol) -> int:
    """Every parameter (or its gradient) of ``model`` equals this rank's part of ``ref``'s."""
    ref_params = dict(ref.named_parameters())
    checked = 0
    for name, p in model.named_parameters():
        r = ref_params[name]
        got, want = (p.grad, r.grad) if grads else (p.detach(), r.detach())
        assert (got is None) == (want is None), f"{name}: gradient presence differs"
        if got is None:
            continue
        spec = get_shard_spec(p)
        if spec is not None:
            want = spec.slice_of(want)
        torch.testing.assert_close(got, want, msg=lambda m, n=name: f"{n} ({grads=}): {m}",
                                   **(tol or TOL))
        checked += 1
    assert checked, "nothing compared"
    return checked


def train_and_compare(ref: nn.Module, model: nn.Module, inputs: Any, *, steps: int = 3,
                      loss_fn: Optional[Callable[[Any], torch.Tensor]] = None,
                      out_fn: Optional[Callable[[Any], Dict[str, torch.Tensor]]] = None,
                      sequence_parallel: bool = False, lr: float = 0.1, **tol) -> None:
    """``steps`` SGD steps on both models; outputs, gradients and parameters must match."""
    loss_fn = loss_fn or scalar_loss
    out_fn = out_fn or outputs_of
    opts = [torch.optim.SGD(m.parameters(), lr=lr) for m in (ref, model)]
    for step in range(steps):
        outs = []
        for m, opt in zip((ref, model), opts):
            opt.zero_grad(set_to_none=True)
            out = m(**inputs) if isinstance(inputs, dict) else m(*inputs)
            loss_fn(out).backward()
            outs.append({k: v.detach() for k, v in out_fn(out).items()})
        if sequence_parallel:  # the schedule's hooks reduced every replicated gradient
            assert reduce_replicated_grads(model) == 0, "a replicated gradient without a hook"
        assert outs[0].keys() == outs[1].keys()
        for k in outs[0]:
            torch.testing.assert_close(outs[1][k], outs[0][k], **(tol or TOL),
                                       msg=lambda m, k=k, step=step: f"step {step} output {k}: {m}")
        assert_params_close(model, ref, grads=True, **tol)
        for opt in opts:
            opt.step()
        assert_params_close(model, ref, grads=False, **tol)


def run_checks(checks: List[Callable[[], Any]]) -> Dict[str, Any]:
    """Run several check functions in one rank process (one spawn for many checks); returns
    ``{function name: its result}``. The first failure propagates (a rank that carried on after
    a failed collective would deadlock its peers)."""
    return {fn.__name__: fn() for fn in checks}


def spawn_checks(checks: List[Callable[[], Any]], world_size: int = 2) -> Dict[str, List[Any]]:
    """``run_checks`` on ``world_size`` gloo ranks: ``{check name: [result of rank 0, ...]}``."""
    per_rank = run_distributed(run_checks, world_size, checks)
    return {fn.__name__: [r[fn.__name__] for r in per_rank] for fn in checks}
