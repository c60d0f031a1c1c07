"""Model FLOPs, TFLOPS per rank and MFU, from each model's real sizes.

Counting convention (the "model FLOPs" of Megatron/PaLM): matmul and convolution FLOPs only,
2 FLOPs per multiply-add, training = 3 x forward (backward = 2 x forward), activation
recomputation *not* counted, so the number does not depend on the checkpoint ratio. Unlike the
artifact's ``3 * (L * (4hs^2 + 8sh^2 + 16sh^2) + 2shV)`` (:func:`artifact_train_flops`), the
FFN uses the real intermediate size (BERT-1B keeps FFN 4096 = 2h), gated FFNs have three
matrices, grouped-query attention has narrower K/V projections, BERT-style MLM heads include their
transform layer, ALBERT/OPT include their embedding projections, T5 counts encoder, decoder
self-attention, cross-attention and the LM head over the decoder tokens, and WideResNet counts
every convolution from its shapes, and mixtures of experts count the router and the top-k experts
a token runs (active parameters). Attention scores are counted for the full ``s x s`` matrix
(also for causal and GPT-Neo local attention, which HF computes as masked full attention).

``measure_gemm_flops`` measures the achievable GEMM rate to report MFU against (call it in the
same run and on the same device as the benchmark).
"""

from __future__ import annotations

import time
from typing import Optional, Tuple, Union

import torch

from end2end.models.build import SpecLike, get_model_spec
from end2end.models.zoo import ModelSpec

__all__ = [
    "forward_flops", "train_flops_per_sample", "artifact_train_flops", "tflops_per_rank",
    "mfu", "measure_gemm_flops", "estimate_step_seconds", "wideresnet_forward_flops",
]


def _layer_flops(spec: ModelSpec, s_q: int, s_kv: int) -> float:
    """One attention block (projections + scores/context) over ``s_q`` queries, ``s_kv`` keys."""
    h, a, kv = spec.hidden, spec.attn_dim, spec.kv_dim
    q_and_out = 2 * s_q * h * a * 2  # query projection and output projection
    k_and_v = 2 * s_kv * h * kv * 2  # key and value projections (over the key tokens)
    scores_and_context = 2 * s_q * s_kv * a * 2
    return q_and_out + k_and_v + scores_and_context


def _ffn_flops(spec: ModelSpec, s: int) -> float:
    """The FFN over ``s`` tokens; a mixture of experts counts its router and the ``top-k``
    experts each token runs (the active parameters), not the idle ones."""
    one = 2 * s * spec.hidden * spec.ffn * (3 if spec.gated_ffn else 2)
    if not spec.is_moe:
        return one
    return one * spec.experts_per_token + 2 * s * spec.hidden * spec.experts


def _head_flops(spec: ModelSpec, s: int) -> float:
    """Embedding projections and the LM head (over ``s`` output tokens)."""
    h, e, v, f = spec.hidden, spec.emb_dim, spec.vocab, spec.family
    if f in ("bert", "roberta"):
        return 2 * s * h * h + 2 * s * h * v  # MLM transform dense + decoder
    if f == "albert":
        return 2 * s * e * h + 2 * s * h * e + 2 * s * e * v  # emb proj, head dense, decoder
    if f == "opt" and e != h:
        return 2 * s * e * h * 2 + 2 * s * e * v  # project_in, project_out, LM head
    return 2 * s * h * v


def wideresnet_forward_flops(spec: ModelSpec) -> float:
    """Convolution + fc FLOPs of one image through a (torchvision-shaped) WideResNet."""

    def conv(c_in: int, c_out: int, k: int, size: int, stride: int, pad: int) -> Tuple[float, int]:
        out = (size + 2 * pad - k) // stride + 1
        return 2.0 * c_in * c_out * k * k * out * out, out

    total, size = conv(3, 64, 7, spec.image_size, 2, 3)
    size = (size + 2 - 3) // 2 + 1  # maxpool 3x3 stride 2 pad 1
    inplanes = 64
    for stage, blocks in enumerate(spec.block_layers):
        planes = 64 * 2**stage
        width = int(planes * spec.width_per_group / 64.0)
        for i in range(blocks):
            stride = 2 if (i == 0 and stage > 0) else 1
            f1, _ = conv(inplanes, width, 1, size, 1, 0)
            f2, out = conv(width, width, 3, size, stride, 1)
            f3, _ = conv(width, planes * 4, 1, out, 1, 0)
            total += f1 + f2 + f3
            if i == 0:  # downsample (stride and/or channel change)
                total += conv(inplanes, planes * 4, 1, size, stride, 0)[0]
            inplanes, size = planes * 4, out
    return total + 2.0 * inplanes * spec.num_classes


def forward_flops(model: SpecLike, seq_len: int, dec_seq_len: int = 0) -> float:
    """Forward FLOPs of one sample (sequence / image) of ``model``."""
    spec = get_model_spec(model)
    if spec.is_vision:
        return wideresnet_forward_flops(spec)
    s = seq_len
    if spec.is_encoder_decoder:
        d = dec_seq_len
        if d < 1:
            raise ValueError(f"{spec.name} is encoder-decoder: give dec_seq_len >= 1")
        enc = spec.layers * (_layer_flops(spec, s, s) + _ffn_flops(spec, s))
        dec_layers = spec.decoder_layers or spec.layers
        dec = dec_layers * (_layer_flops(spec, d, d) + _layer_flops(spec, d, s)
                            + _ffn_flops(spec, d))
        return enc + dec + 2 * d * spec.hidden * spec.vocab
    per_layer = _layer_flops(spec, s, s) + _ffn_flops(spec, s)
    return spec.layers * per_layer + _head_flops(spec, s)


def train_flops_per_sample(model: SpecLike, seq_len: int, dec_seq_len: int = 0) -> float:
    """Model FLOPs of one training sample: 3 x forward (recomputation not counted)."""
    return 3.0 * forward_flops(model, seq_len, dec_seq_len)


def artifact_train_flops(model: SpecLike, seq_len: int) -> float:
    """The artifact's formula ``3 * (L*(4hs^2 + 8sh^2 + 16sh^2) + 2shV)`` (FFN assumed 4h), for
    comparison with published numbers only (decoder-only / encoder-only models)."""
    spec = get_model_spec(model)
    L, h, s, v = spec.layers, spec.hidden, seq_len, spec.vocab
    return 3.0 * (L * (4 * h * s * s + 8 * s * h * h + 16 * s * h * h) + 2 * s * h * v)


def tflops_per_rank(samples_per_s: float, flops_per_sample: float, ranks: int) -> float:
    """Achieved model TFLOP/s per rank/GPU: ``samples/s x FLOPs/sample / ranks / 1e12``."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    return samples_per_s * flops_per_sample / ranks / 1e12


def mfu(samples_per_s: float, flops_per_sample: float, ranks: int,
        peak_flops_per_rank: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s per rank over the peak FLOP/s of one rank."""
    if peak_flops_per_rank <= 0:
        raise ValueError(f"peak_flops_per_rank must be > 0, got {peak_flops_per_rank}")
    return tflops_per_rank(samples_per_s, flops_per_sample, ranks) * 1e12 / peak_flops_per_rank


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_gemm_flops(device: Union[str, torch.device] = "cpu",
                       dtype: torch.dtype = torch.float32, size: int = 1024,
                       seconds: float = 1.0, shape: Optional[Tuple[int, int, int]] = None,
                       warmup: int = 3) -> float:
    """Achievable matmul rate in FLOP/s on ``device`` (``[m,k] @ [k,n]``, default square).

    Runs ``warmup`` untimed matmuls, then as many as fit in ``seconds`` (at least 3), with device
    synchronisation around the timed region. Use a transformer-shaped ``shape`` such as
    ``(2048, 768, 3072)`` for a realistic peak. With several ranks on one host (CPU), call it on
    all ranks at the same time (after a barrier) so the rate reflects the shared cores.
    """
    device = torch.device(device)
    m, k, n = shape or (size, size, size)
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(k, n, generator=g).to(device=device, dtype=dtype)
    out = torch.empty(m, n, device=device, dtype=dtype)
    for _ in range(max(1, warmup)):
        torch.matmul(a, b, out=out)
    _sync(device)
    iters, start = 0, time.perf_counter()
    while True:
        torch.matmul(a, b, out=out)
        iters += 1
        if iters >= 3 and iters % 2 == 0:
            _sync(device)
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
    return 2.0 * m * k * n * iters / elapsed


def estimate_step_seconds(model: SpecLike, batch_size: int, seq_len: int, dec_seq_len: int = 0,
                          flops_per_s: float = 150e9, efficiency: float = 0.5) -> float:
    """Rough wall time of one training step of ``batch_size`` samples on a machine doing
    ``flops_per_s`` GEMM at ``efficiency`` (for sizing configs; ranks share the machine)."""
    return batch_size * train_flops_per_sample(model, seq_len, dec_seq_len) / (
        flops_per_s * efficiency)
