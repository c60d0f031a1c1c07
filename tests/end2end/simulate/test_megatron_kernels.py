"""Megatron-LM's fused softmax on a simulated GPU (issue 35): the ``megatron`` baseline in
fp16 takes the fused scale-mask-softmax kernel where its CUDA extension imports, as Megatron-LM
trains; on the simulated GPU the extension's stand-in reads and writes the scores once, where
megatron-core's PyTorch fallback (this CPU) casts, scales, masks and casts back."""

from __future__ import annotations

import pytest

from end2end.simulate.cost.megatron_kernels import batch_per_block
from end2end.simulate.engine.isolated import isolated


@pytest.mark.parametrize("sk, want", [(2048, 4), (128, 8), (64, 8), (16, 16)])
def test_batch_per_block_follows_the_kernels_launch(sk, want):
    # 128 threads; a warp of min(32, next power of two of sk) lanes per row; two rows per warp
    # when sk fits 128
    assert batch_per_block(sk, sk, 2, 4) == want


def _softmax_ops(gpu) -> dict:
    """Names of the forward's non-view ops of one ``megatron`` tiny GPT-2 step in fp16, on a
    simulated GPU (``gpu``: its compute capability) or as on this CPU (``False``)."""
    from end2end.spec.config_file import make_run_spec
    from end2end.spec.layout import run_layout
    from end2end.simulate.engine.step import simulate_rank

    spec = make_run_spec("megatron", "tiny/gpt2", 1, 64, 0, 2, "0", steps=1, warmup=0,
                         dtype="fp16")
    result = simulate_rank(spec, run_layout(spec), 0, gpu=gpu)
    names = [op.name for op in result.ops if op.phase == "forward" and not op.view]
    return {name: names.count(name) for name in ("_softmax", "masked_fill_", "_to_copy")}


def test_megatron_in_fp16_runs_the_fused_softmax_on_a_gpu_and_the_fallback_on_the_cpu():
    gpu = isolated("tests.end2end.simulate.test_megatron_kernels._softmax_ops", (8, 0))
    cpu = isolated("tests.end2end.simulate.test_megatron_kernels._softmax_ops", False)
    layers = 2  # tiny/gpt2
    assert gpu["_softmax"] == layers and gpu["masked_fill_"] == 0, gpu
    assert cpu["_softmax"] == layers and cpu["masked_fill_"] == layers, cpu
    assert cpu["_to_copy"] >= gpu["_to_copy"] + 2 * layers, (cpu, gpu)  # fp32 and back


def test_the_stand_in_modules_leave_with_the_context():
    import sys

    from end2end.driver.baselines.megatron_core import (FUSED_SOFTMAX_MODULES,
                                                        fused_softmax_available)
    from end2end.simulate.cost.megatron_kernels import fused_softmax_kernels

    assert not fused_softmax_available()  # no CUDA extension on this machine
    with fused_softmax_kernels():
        assert fused_softmax_available()
    assert not any(name in sys.modules for name in FUSED_SOFTMAX_MODULES)
