"""Numerical comparison of an original and a scheduled model: outputs *and* gradients."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional, Tuple

import torch
from torch import nn

__all__ = ["train_step", "grads_of", "assert_same_training", "scalar_loss"]


def scalar_loss(out: Any) -> torch.Tensor:
    """A scalar to backpropagate from a model output: ``out.loss`` if present, else a fixed
    random projection of the (first) output tensor (so every element gets a distinct grad)."""
    loss = getattr(out, "loss", None)
    if loss is not None:
        return loss
    if isinstance(out, (tuple, list)):
        out = out[0]
    if hasattr(out, "last_hidden_state"):
        out = out.last_hidden_state
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(out.shape, generator=g, dtype=torch.float32).to(out.device, out.dtype)
    return (out * w).sum()


def outputs_of(out: Any) -> Dict[str, torch.Tensor]:
    """The tensors of a model output, by name (``loss``, ``logits`` ... or ``out``)."""
    if isinstance(out, torch.Tensor):
        return {"out": out}
    if isinstance(out, dict):  # HF ModelOutput is a dict
        return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
    if isinstance(out, (tuple, list)):
        return {f"out[{i}]": v for i, v in enumerate(out) if isinstance(v, torch.Tensor)}
    raise TypeError(f"cannot compare outputs of type {type(out).__name__}")


def grads_of(model: nn.Module) -> Dict[str, torch.Tensor]:
    """Clones of the gradients of ``model``'s parameters, by name (``None`` grads skipped)."""
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def train_step(model: nn.Module, inputs: Any, seed: int = 0) -> Tuple[Dict[str, torch.Tensor],
                                                                    Dict[str, torch.Tensor]]:
    """Forward + backward with ``torch.manual_seed(seed)``; returns (outputs, grads)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    scalar_loss(out).backward()
    return {k: v.detach() for k, v in outputs_of(out).items()}, grads_of(model)


def assert_same_training(
    reference: nn.Module,
    scheduled: nn.Module,
    inputs: Any,
    *,
    seed: int = 0,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    name_map: Optional[Dict[str, str]] = None,
    ignore: Iterable[str] = (),
) -> None:
    """Assert that one training step gives the same outputs and parameter gradients.

    Gradients are compared by parameter name (``name_map`` maps reference names to scheduled
    names where a schedule renamed them); every reference parameter with a gradient must have a
    matching gradient in the scheduled model, except names listed in ``ignore``.
    """
    ref_out, ref_grads = train_step(reference, inputs, seed)
    sch_out, sch_grads = train_step(scheduled, inputs, seed)
    assert ref_out.keys() == sch_out.keys(), f"outputs differ: {ref_out.keys()} vs {sch_out.keys()}"
    for k in ref_out:
        torch.testing.assert_close(sch_out[k], ref_out[k], rtol=rtol, atol=atol,
                                   msg=lambda m, k=k: f"output '{k}': {m}")
    name_map = name_map or {}
    ignore = set(ignore)
    assert ref_grads, "the reference model produced no gradients"
    for name, g in ref_grads.items():
        if name in ignore:
            continue
        other = name_map.get(name, name)
        assert other in sch_grads, f"no gradient for '{other}' in the scheduled model"
        torch.testing.assert_close(sch_grads[other], g, rtol=rtol, atol=atol,
                                   msg=lambda m, n=name: f"gradient of '{n}': {m}")
