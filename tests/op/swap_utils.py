"""Swap HF submodules for slapo ops in a tiny model and compare a whole training step."""

from __future__ import annotations

import copy
from typing import Callable, Dict, Sequence

import torch
from torch import nn

import slapo
from slapo.testing import assert_same_training, example_inputs, tiny_model

TOL = dict(atol=1e-5, rtol=1e-5)


def grads_as_weights(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters hold its gradients (zeros where there is none).

    A from-HF builder only re-lays weights (transpose, slice, fuse), a linear map; applied to
    this copy it yields the gradients in the new module's layout.
    """
    clone = copy.deepcopy(module)
    with torch.no_grad():
        for (_, p), (_, src) in zip(clone.named_parameters(), module.named_parameters()):
            p.copy_(src.grad if src.grad is not None else torch.zeros_like(src))
    return clone


def check_swap(family: str, paths: Sequence[str], build: Callable[[nn.Module], nn.Module], *,
               train: bool = True, seq: int = 8, pad: bool = True,
               **model_overrides) -> Dict[str, nn.Module]:
    """Replace ``paths`` in a tiny ``family`` model by ``build(old)`` with slapo and assert that
    outputs and all gradients match the untouched model. Returns the new modules by path."""
    ref = tiny_model(family, **model_overrides).train(train)
    model = tiny_model(family, **model_overrides).train(train)
    sch = slapo.create_schedule(model)
    for p in paths:
        sch[p].replace(build(sch[p].mod))
    new = {p: model.get_submodule(p) for p in paths}
    for p, m in new.items():
        assert type(m).__module__.startswith("slapo.op"), f"{p} was not replaced"
    inputs = example_inputs(family, seq=seq)
    if not pad:
        inputs["attention_mask"][:] = 1
    ignore = [n for n, _ in ref.named_parameters() if any(n.startswith(p + ".") for p in paths)]
    assert_same_training(ref, model, inputs, ignore=ignore, **TOL)
    for p, m in new.items():
        expected = dict(build(grads_as_weights(ref.get_submodule(p))).named_parameters())
        got = dict(m.named_parameters())
        assert got.keys() == expected.keys()
        for name, param in got.items():
            assert param.grad is not None, f"no gradient for {p}.{name}"
            torch.testing.assert_close(param.grad, expected[name], **TOL,
                                       msg=lambda msg, n=f"{p}.{name}": f"grad of {n}: {msg}")
    return new
