"""Compare a scheduled model with the unscheduled HF model after one training step, on one rank
or on every rank of a TP group: outputs (gathered when sharded), and the gradient of every
reference parameter -- including those the schedule renamed (op-library attention and MLPs:
``query`` -> ``q_proj``, fused ``qkv_proj``, GPT-2's Conv1D ``c_attn`` ...), rebuilt in the
original layout from the op library's provenance records
(:class:`slapo.verification.tools.DerivedParams`, what ``slapo.verify`` uses)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Dict

import torch
from torch import nn

from slapo.model_schedule import apply_schedule
from slapo.sharding import reduce_replicated_grads
from slapo.testing import example_inputs, tiny_model
from slapo.verification.tools import DerivedParams, to_full

TOL = dict(rtol=1e-4, atol=2e-5)

def outputs_of(out: Any) -> Dict[str, torch.Tensor]:
    if dataclasses.is_dataclass(out) and not isinstance(out, dict):
        out = {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}
    if isinstance(out, torch.Tensor):
        return {"out": out}
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def compare_training(ref: nn.Module, model: nn.Module, inputs: Dict[str, Any], *, group=None,
                     sequence_parallel: bool = False) -> int:
    """One forward/backward of both; outputs and every reference gradient must match."""
    outs = []
    for m in (ref, model):
        m.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        out = outputs_of(m(**inputs))
        out["loss"].backward()
        outs.append(out)
    if sequence_parallel:  # the schedule's hooks reduced every replicated gradient
        assert reduce_replicated_grads(model, group) == 0, "a replicated gradient without a hook"
    for k, want in outs[0].items():
        got = to_full(outs[1][k].detach(), group, like=want)
        torch.testing.assert_close(got, want.detach(), **TOL, msg=lambda m, k=k: f"{k}: {m}")
    ref_params = dict(ref.named_parameters())
    params = dict(model.named_parameters())
    done = set()
    for name, p in params.items():
        if name in ref_params and p.grad is not None:
            got = to_full(p.grad, group, p.grad, param=p)
            torch.testing.assert_close(got, ref_params[name].grad, **TOL,
                                       msg=lambda m, n=name: f"grad {n}: {m}")
            done.add(name)
    # parameters the schedule renamed or fused, rebuilt from the op library's provenance records
    for name, got in DerivedParams(model, ref_params, params).rebuild(group, grad=True).items():
        assert got is not None, f"no gradient for {name} (renamed by the schedule)"
        torch.testing.assert_close(got, ref_params[name].grad, **TOL,
                                   msg=lambda m, n=name: f"grad {n}: {m}")
        done.add(name)
    missing = {n for n, p in ref_params.items() if p.grad is not None} - done
    assert not missing, f"gradients not compared: {sorted(missing)[:5]}"
    return len(done)


def wideresnet(seed: int = 0) -> nn.Module:
    """A tiny WideResNet in float64: train-mode BatchNorm over a batch of 2 amplifies float32
    rounding (channel-split convolutions sum in another order) beyond fp32 tolerances."""
    from end2end.models.wideresnet import WideResNetForImageClassification

    torch.manual_seed(seed)
    return WideResNetForImageClassification([1, 2, 1, 1], width_per_group=16,
                                            num_classes=8).double().train()


def wideresnet_inputs() -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(2, 3, 32, 32, generator=g, dtype=torch.float64),
            "labels": torch.tensor([1, 5])}


def check_family(family: str, group=None, **knobs: Any) -> int:
    """Schedule a tiny ``family`` model with ``knobs`` and compare one training step."""
    if family == "wideresnet":
        ref, inputs = wideresnet(), wideresnet_inputs()
    else:
        ref, inputs = tiny_model(family), example_inputs(family)
    model = copy.deepcopy(ref)
    apply_schedule(model, family, group=group, **knobs)
    return compare_training(ref, model, inputs, group=group,
                            sequence_parallel=knobs.get("sequence_parallel", False))
