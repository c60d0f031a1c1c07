"""Megatron's fused softmax kernels on a simulated GPU.

Megatron-LM trains with attention's scale, mask and softmax fused into one CUDA kernel (the
``megatron`` baseline fuses wherever the extension exists:
:func:`end2end.driver.baselines.megatron_core.fused_softmax_available`). The extensions cannot
exist on the CPU the fake tensors live on, where megatron-core's PyTorch fallback runs instead:
a cast of the scores to fp32, a scaling, a masked fill, the softmax and a cast back, five passes
over the ``B x H x s x s`` scores where the kernel reads and writes them once.

Within :func:`fused_softmax_kernels` (entered for every GPU profile) stand-ins of the three
extension modules are importable. Each does the kernel's memory traffic as one ATen op on the
fake tensors: forward, a softmax over the last dimension (read the scores, write the
probabilities, in their dtype); backward, softmax's backward (read the gradient and the
probabilities, write the input's gradient). Their values are not the kernels' (the mask and the
scale are left out): fake tensors carry none. ``get_batch_per_block`` follows the kernels' own
launch arithmetic (``scaled_masked_softmax.h``: 128 threads per block, one warp of up to 32
lanes per row of keys, two rows per warp when the keys fit 128), which megatron-core's
``is_kernel_available`` reads.
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Iterator

import torch

__all__ = ["fused_softmax_kernels", "batch_per_block"]


def batch_per_block(sq: int, sk: int, b: int, np: int) -> int:
    """Rows of attention one thread block of the fused softmax takes (module docstring)."""
    next_power_of_two = 1 << max(0, (sk - 1).bit_length())
    warp_size = min(next_power_of_two, 32)
    batches_per_warp = 2 if next_power_of_two <= 128 else 1
    return (128 // warp_size) * batches_per_warp


def _forward(inputs: torch.Tensor, *_mask_and_scale) -> torch.Tensor:
    return torch.softmax(inputs, dim=-1)


def _backward(output_grads: torch.Tensor, softmax_results: torch.Tensor, _scale) -> torch.Tensor:
    return torch.ops.aten._softmax_backward_data(output_grads, softmax_results, -1,
                                                 softmax_results.dtype)


def _module(name: str) -> types.ModuleType:
    import importlib.machinery

    module = types.ModuleType(name, f"stand-in for Megatron's {name} on a simulated GPU")
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.forward, module.backward = _forward, _backward  # type: ignore[attr-defined]
    module.get_batch_per_block = batch_per_block  # type: ignore[attr-defined]
    return module


@contextlib.contextmanager
def fused_softmax_kernels() -> Iterator[None]:
    """Within: megatron's fused softmax extensions import as their stand-ins (module
    docstring); a real extension already imported is left as it is."""
    from end2end.driver.baselines.megatron_core import FUSED_SOFTMAX_MODULES

    added = [name for name in FUSED_SOFTMAX_MODULES if name not in sys.modules]
    for name in added:
        sys.modules[name] = _module(name)
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)
