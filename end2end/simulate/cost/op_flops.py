"""FLOPs of the ATen ops that PyTorch's FLOP table (:data:`torch.utils.flop_counter.flop_registry`)
lacks but a simulated CPU step runs: the CPU's fused attention
(``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward, what
``F.scaled_dot_product_attention`` runs on a CPU without attention dropout). Without them a Slapo
schedule that swaps eager attention for SDPA would look free on the ``cpu`` profile.

The counts are PyTorch's own SDPA formulas (:func:`torch.utils.flop_counter.sdpa_flop_count`,
``sdpa_backward_flop_count``: ``4 B H Lq Lk d`` forward, twice that and a half backward), halved
for a causal mask: the CPU kernel skips the blocks above the diagonal.
"""

from __future__ import annotations

from typing import Callable, Dict

import torch
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

__all__ = ["EXTRA_FLOPS"]


def _causal(flops: int, is_causal: bool) -> int:
    return flops // 2 if is_causal else flops


def _cpu_flash_forward(query, key, value, dropout_p=0.0, is_causal=False, *_, out_val=None,
                       **__) -> int:
    return _causal(sdpa_flop_count(query.shape, key.shape, value.shape), is_causal)


def _cpu_flash_backward(grad_out, query, key, value, out, logsumexp, dropout_p=0.0,
                        is_causal=False, *_, out_val=None, **__) -> int:
    flops = sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)
    return _causal(flops, is_causal)


#: ATen overload packet -> ``count(*args, **kwargs, out_val=...)``, as in torch's flop_registry
EXTRA_FLOPS: Dict[object, Callable[..., int]] = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_forward,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward,
}
