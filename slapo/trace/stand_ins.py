"""Stand-ins for meta tensors, so a model built under ``slapo.init_empty_weights()`` can run its
forward for tracing and input capture without materialising a single weight.

Value-propagating tracing (:mod:`slapo.trace.tracer`) and input capture run the model once on
example inputs. With meta parameters that run fails: real buffers and inputs meet meta weights
(``Tensor on device meta is not on the expected device cpu`` in GPT-Neo's ``torch.where`` on its
causal mask), and masks computed on the weights' device become meta, so Python decisions on them
(``padding_mask.all()`` in transformers' mask utilities) have no value.

:func:`meta_stand_ins` swaps every meta parameter and buffer for a *stand-in*: a zero tensor of
the same shape and dtype on the device of the model's real tensors, with ``requires_grad=False``
(so no autograd graph holds on to anything). Stand-ins of the same shape and dtype share one
zero tensor, so the memory they take is one tensor per distinct shape (for a transformer: one
layer's weights plus the embedding), not the model's; ties stay ties. (Stride-0 expansions of a
single zero would take no memory at all, but every matmul then copies its weight: 10x slower.)
The originals are put back on exit; a traced graph keeps the original (meta) tensors.

What this means for a trace: activations are computed from zero weights, so Python control flow
on *activations* (rare; HF models branch on inputs, masks and shapes) sees zeros. Buffers created
on meta (``init_empty_weights(include_buffers=True)``) are zeros too.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator, List, Tuple

import torch
from torch import nn

__all__ = ["meta_stand_ins", "has_meta"]


def has_meta(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` is on the meta device."""
    return any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))


def _stand_in_device(model: nn.Module) -> torch.device:
    for t in list(model.buffers()) + list(model.parameters()):
        if not t.is_meta:
            return t.device
    return torch.device("cpu")


def _stand_in(t: torch.Tensor, is_param: bool, zeros: Dict[tuple, torch.Tensor],
              device: torch.device) -> torch.Tensor:
    key = (tuple(t.shape), t.dtype)
    if key not in zeros:
        zeros[key] = torch.zeros(t.shape, dtype=t.dtype, device=device)
    return nn.Parameter(zeros[key], requires_grad=False) if is_param else zeros[key]


@contextlib.contextmanager
def meta_stand_ins(model: nn.Module) -> Iterator[None]:
    """Inside the block, the meta parameters and buffers of ``model`` are zero stand-ins, one
    tensor per distinct shape (see module docstring); the originals are restored on exit. A
    no-op for a model without meta tensors."""
    if not has_meta(model):
        yield
        return
    device = _stand_in_device(model)
    made: Dict[int, torch.Tensor] = {}
    zeros: Dict[tuple, torch.Tensor] = {}
    swapped: List[Tuple[Dict[str, torch.Tensor], str, torch.Tensor]] = []
    for mod in model.modules():
        for table, is_param in ((mod._parameters, True), (mod._buffers, False)):
            for name, t in list(table.items()):
                if t is None or not t.is_meta:
                    continue
                if id(t) not in made:
                    made[id(t)] = _stand_in(t, is_param, zeros, device)
                swapped.append((table, name, t))
                table[name] = made[id(t)]
    try:
        yield
    finally:
        for table, name, t in swapped:
            table[name] = t
