"""Attention kernels chosen by PyTorch's own CUDA rules for the simulated GPU (issue 35):
``sdp_utils.cpp``'s flash, memory-efficient and math eligibility by compute capability, dtype,
head size, mask and causality, and what each keeps for the backward."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from end2end.simulate.cost.kernels import GpuAttention, select_kernel
from end2end.simulate.engine.recorder import StepRecorder

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
V100, A100, H100, RTX4090 = (7, 0), (8, 0), (9, 0), (8, 9)


def _qkv(d: int, dtype, lq: int = 128, lk: int = 128, dv: int = 0):
    q = torch.empty(2, 4, lq, d, dtype=dtype, device="meta")
    k = torch.empty(2, 4, lk, d, dtype=dtype, device="meta")
    v = torch.empty(2, 4, lk, dv or d, dtype=dtype, device="meta")
    return q, k, v


@pytest.mark.parametrize("cap, d, dtype, mask, causal, want", [
    (V100, 110, F16, False, True, "math"),       # GPT-2.9B on a V100: no flash, 110 % 8 != 0
    (V100, 128, F16, True, False, "efficient"),  # BERT with its padding mask
    (V100, 110, F32, False, False, "efficient"),  # fp32 below sm80: alignment 1
    (V100, 64, BF16, False, False, "math"),      # no bf16 before sm80
    (A100, 110, F16, False, True, "flash"),      # flash pads the head size itself
    (A100, 64, F16, True, False, "efficient"),   # flash takes no attn_mask
    (A100, 64, F32, False, False, "efficient"),  # flash: fp16/bf16 only
    (A100, 66, F32, False, False, "math"),       # fp32 from sm80: alignment 4
    (A100, 288, BF16, False, False, "efficient"),  # flash: head size <= 256
    (H100, 128, BF16, False, True, "flash"),
    (RTX4090, 200, F16, False, False, "efficient"),  # sm86-89 training, head in (192, 224]
])
def test_kernel_choice_follows_sdp_utils(cap, d, dtype, mask, causal, want):
    q, k, v = _qkv(d, dtype)
    assert select_kernel(q, k, v, mask, 0.1, causal, cap) == want


def test_causal_with_a_longer_key_and_unequal_value_heads_leave_flash():
    q, k, v = _qkv(64, F16, lq=64, lk=128)
    assert select_kernel(q, k, v, False, 0.0, True, A100) == "efficient"
    assert select_kernel(q, k, v, False, 0.0, False, A100) == "flash"
    q, k, v = _qkv(64, F16, dv=128)
    assert select_kernel(q, k, v, False, 0.0, False, A100) == "efficient"


def _peak_and_kernels(cap, d: int, seq: int = 256):
    with FakeTensorMode():
        q, k, v = (torch.randn(2, 4, seq, d, dtype=F16, requires_grad=True) for _ in range(3))
        mode = GpuAttention(cap)
        with StepRecorder() as rec, mode:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1,
                                                                   is_causal=True)
            kept = rec.live  # what the forward left alive for the backward
            out.sum().backward()
    return kept, mode.chosen, rec


def test_the_math_path_keeps_the_scores_and_the_fused_kernels_do_not():
    """Head size 110 in fp16 on sm70 runs the math path, which keeps the B x H x s x s scores
    for the backward (the fused kernels keep O(s) per row); its GEMMs are recorded as GEMMs
    with their shapes, the fused kernels as one op with FLOPs."""
    scores = 2 * 4 * 256 * 256 * 2
    math_kept, math_chosen, math_rec = _peak_and_kernels(V100, 110)
    fused_kept, fused_chosen, fused_rec = _peak_and_kernels(V100, 112)
    flash_kept, flash_chosen, flash_rec = _peak_and_kernels(A100, 110)
    assert math_chosen == {"math": 1} and fused_chosen == {"efficient": 1}
    assert flash_chosen == {"flash": 1}
    assert math_kept - fused_kept >= scores
    assert abs(flash_kept - fused_kept) < scores / 4
    gemms = [op for op in math_rec.ops if op.name in ("bmm", "mm")]
    assert gemms and all(op.shape and op.shape[0] == 8 for op in gemms)
    for rec, name in ((flash_rec, "_scaled_dot_product_flash_attention"),
                      (fused_rec, "_scaled_dot_product_efficient_attention")):
        fwd = [op for op in rec.ops if op.name == name]
        assert len(fwd) == 1 and fwd[0].flops > 0, [op.name for op in rec.ops]


def _dropout_step(inplace: bool = False, checkpointed: bool = False):
    """A fp16 tensor through ``F.dropout`` (p 0.1, training) and back, recorded within
    :class:`GpuAttention` on fake tensors: the ops' names and the bytes they moved."""
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    def block(x):
        return F.dropout(x * 2, p=0.1, training=True, inplace=inplace)

    with FakeTensorMode():
        x = torch.randn(64, 1024, dtype=F16, requires_grad=True)
        with StepRecorder() as rec, GpuAttention(A100):
            y = checkpoint(block, x, use_reentrant=False) if checkpointed else block(x)
            y.sum().backward()
    return [op.name for op in rec.ops if not op.view], sum(op.bytes for op in rec.ops)


def test_dropout_runs_cudas_fused_kernel():
    """CUDA's ``dropout`` is ATen's ``native_dropout`` (one kernel: the output and a one-byte
    mask; its backward one multiply), where a CPU draws a random tensor of the input's size and
    multiplies it in (``bernoulli_``, ``div_``, ``mul``: three times the bytes). In place, CUDA
    has no fused path either. Recomputed under checkpointing it runs the same kernel (no
    ``CheckpointError`` from a different set of saved tensors)."""
    names, moved = _dropout_step()
    assert "native_dropout" in names and "bernoulli_" not in names, names
    assert "native_dropout_backward" in names, names
    _, cpu_moved = _dropout_step(inplace=True)  # the CPU's decomposition, as in place on CUDA
    assert "bernoulli_" in _dropout_step(inplace=True)[0]
    assert moved < cpu_moved, (moved, cpu_moved)
    names, _ = _dropout_step(checkpointed=True)
    assert names.count("native_dropout") == 2, names  # forward, and again when recomputed


def _kernels_of(mode: str, model: str) -> dict:
    """The attention kernels one simulated step of ``model`` on an A100 took (bf16)."""
    from end2end.spec.config_file import make_run_spec
    from end2end.spec.layout import run_layout
    from end2end.simulate.engine.step import simulate_rank

    spec = make_run_spec(mode, model, 1, 64, 0, 2, "0", steps=1, warmup=0, dtype="bf16")
    return simulate_rank(spec, run_layout(spec), 0, gpu=A100).attention


@pytest.mark.parametrize("mode, model", [("eager", "tiny/llama"), ("slapo-fsdp", "tiny/llama"),
                                         ("eager", "tiny/gpt2")])
def test_an_all_ones_padding_mask_is_dropped_as_on_a_gpu(mode, model):
    """HF drops the driver's all-ones padding mask before SDPA on a real run (``is_causal``
    instead), so an A100 takes the flash kernel; on fake tensors HF could not read the mask
    and kept it, and the mask ruled flash out (the memory-efficient kernel, at half flash's
    efficiency: Llama 3 8B was predicted 27 % slow)."""
    from end2end.simulate.engine.isolated import isolated

    chosen = isolated("tests.end2end.simulate.test_kernels._kernels_of", mode, model)
    assert chosen == {"flash": 2}, chosen  # both layers of the tiny model


def _mask_bytes_of(mode: str, model: str) -> int:
    """Bytes that ops on boolean tensors moved in one simulated CPU step of ``model`` (batch 2,
    sequence 64)."""
    from end2end.spec.config_file import make_run_spec
    from end2end.spec.layout import run_layout
    from end2end.simulate.engine.step import simulate_rank

    spec = make_run_spec(mode, model, 1, 64, 0, 2, "0", steps=1, warmup=0)
    return sum(op.bytes for op in simulate_rank(spec, run_layout(spec), 0).ops
               if op.dtype == "bool")


@pytest.mark.parametrize("model", ["tiny/llama", "tiny/bert"])
def test_the_cpu_profile_drops_the_padding_mask_too(model):
    """A real CPU run drops the all-ones padding mask as a GPU run does (HF's rule does not
    look at the device); the ``cpu`` profile used to keep the fake one and build a
    ``B x 1 x s x s`` boolean mask no measured run builds (11-28 kB of boolean traffic here
    without the rule, about 1 kB with it). Not GPT-2: with attention dropout CPU SDPA takes its
    math path, which builds an ``s x s`` causal mask of its own, as on a real run."""
    from end2end.simulate.engine.isolated import isolated

    moved = isolated("tests.end2end.simulate.test_kernels._mask_bytes_of", "eager", model)
    assert moved < 2 * 64 * 64, moved  # less than one B x 1 x s x s mask


def test_blocked_local_attention_takes_a_fused_kernels_output_layout():
    """A fused CUDA kernel returns its output in [B, L, H, D] memory order: Slapo's blocked
    local attention (GPT-Neo's window) viewed it as contiguous and failed on a V100's
    memory-efficient kernel (found by simulating GPT-Neo 1.3B at seq 1024)."""
    from slapo.op import attention

    with FakeTensorMode():
        q, k, v = (torch.randn(2, 4, 1024, 128, dtype=F16, requires_grad=True)
                   for _ in range(3))
        with GpuAttention(V100) as mode:
            out = attention(q, k, v, causal=True, window_size=256, dropout_p=0.1)
            out.sum().backward()
    assert tuple(out.shape) == (2, 4, 1024, 128) and mode.chosen.get("efficient", 0) >= 1
