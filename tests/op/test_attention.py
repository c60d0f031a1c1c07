"""slapo.op attention: the core op vs its eager reference, the self-attention layer, the fused-QKV
layout under a simulated tensor-parallel split, and every HF adapter swapped into a tiny model."""

import sys

import pytest
import torch

from slapo.errors import OpError
from slapo.op import (
    AttentionOp,
    SelfAttention,
    attention,
    attention_from_hf,
    attention_reference,
    fuse_qkv,
    padding_mask,
    split_qkv,
)
from slapo.op.attention import structure_mask

from .swap_utils import TOL, check_swap

B, H, S, D = 2, 4, 6, 8


def _qkv(hkv=H, q_len=S, k_len=S, grad=True):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, q_len, D, generator=g)
    k = torch.randn(B, hkv, k_len, D, generator=g)
    v = torch.randn(B, hkv, k_len, D, generator=g)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def _pad_mask(k_len=S):
    m = torch.ones(B, k_len, dtype=torch.long)
    m[0, -2:] = 0
    return padding_mask(m)


def _additive(mask):
    return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)


CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "bool_pad": dict(mask="bool"),
    "float_pad": dict(mask="float"),
    "causal_pad": dict(causal=True, mask="bool"),
    "window": dict(causal=True, window_size=2),
    "window_pad_float": dict(causal=True, window_size=3, mask="float"),
    "scale": dict(scale=1.0),
    "gqa": dict(hkv=2, causal=True),
    "gqa_pad": dict(hkv=1, mask="bool"),
    "gqa_repeat": dict(hkv=2, enable_gqa=False),
    "cache_causal": dict(causal=True, q_len=2),  # bottom-right aligned
}


@pytest.mark.parametrize("backend", ["auto", "math"])
@pytest.mark.parametrize("case", list(CASES))
def test_attention_matches_reference(case, backend):
    c = dict(CASES[case])
    q, k, v = _qkv(c.pop("hkv", H), q_len=c.pop("q_len", S))
    kind = c.pop("mask", None)
    mask = None if kind is None else _pad_mask()
    if kind == "float":
        mask = _additive(mask).requires_grad_()
    gqa = c.pop("enable_gqa", None)
    out = attention(q, k, v, mask, backend=backend, enable_gqa=gqa, **c)
    grads = torch.autograd.grad(out.square().sum(), [q, k, v])
    ref = attention_reference(q, k, v, mask, **c)
    ref_grads = torch.autograd.grad(ref.square().sum(), [q, k, v])
    torch.testing.assert_close(out, ref, **TOL)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("s,w,hkv", [(12, 4, H), (11, 3, H), (13, 2, 2), (9, 4, 1)])
@pytest.mark.parametrize("backend", ["auto", "math"])
def test_local_window_blocked_path_matches_band_reference(s, w, hkv, backend, monkeypatch):
    """Long sequences without a mask take the block-by-block path (spied, so a dispatch
    regression fails here); it must equal the full band-mask reference, padding included."""
    core = sys.modules["slapo.op.attention"]

    calls = []
    real = core._blocked_local_attention
    monkeypatch.setattr(core, "_blocked_local_attention",
                        lambda *a, **kw: calls.append(a[4]) or real(*a, **kw))
    q, k, v = _qkv(hkv, q_len=s, k_len=s)
    out = attention(q, k, v, causal=True, window_size=w, backend=backend)
    assert calls == [w]
    ref = attention_reference(q, k, v, causal=True, window_size=w)
    torch.testing.assert_close(out, ref, **TOL)
    grads = torch.autograd.grad(out.square().sum(), [q, k, v])
    ref_grads = torch.autograd.grad(ref.square().sum(), [q, k, v])
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, **TOL)


def test_window_covering_every_key_is_plain_causal():
    q, k, v = _qkv()
    torch.testing.assert_close(attention(q, k, v, causal=True, window_size=S),
                               attention(q, k, v, causal=True), **TOL)


def test_cpu_flash_kernel_when_it_applies():
    q, k, v = _qkv()
    out = attention(q, k, v, causal=True, backend="flash")
    torch.testing.assert_close(out, attention_reference(q, k, v, causal=True), **TOL)


def test_structure_mask_is_bottom_right_causal_window():
    for q_len, k_len, w in [(5, 5, None), (5, 5, 2), (2, 6, None), (3, 7, 3)]:
        m = structure_mask(q_len, k_len, causal=True, window_size=w, device=torch.device("cpu"))
        for i in range(q_len):
            p = k_len - q_len + i
            for j in range(k_len):
                assert bool(m[i, j]) == (0 <= p - j < (w or k_len + 1)), (q_len, k_len, w, i, j)


def test_dropout_only_in_training():
    q, k, v = _qkv(grad=False)
    op = AttentionOp(dropout=0.5)
    clean = attention(q, k, v)
    torch.testing.assert_close(op.eval()(q, k, v), clean)
    op.train()
    torch.manual_seed(0)
    a = op(q, k, v)
    torch.manual_seed(0)
    assert torch.equal(a, op(q, k, v))  # seeded: reproducible
    assert not torch.allclose(a, clean)
    assert not torch.allclose(a, op(q, k, v))


@pytest.mark.parametrize("call, match", [
    (lambda q, k, v: attention(q, k, v, backend="xformers"), "unknown attention backend"),
    (lambda q, k, v: attention(q, k, v, backend="efficient"), "runs on CUDA only"),
    (lambda q, k, v: attention(q, k, v, backend="cudnn"), "runs on CUDA only"),
    (lambda q, k, v: attention(q, k, v, torch.ones(B, 1, S, S, dtype=torch.long)), "dtype"),
    (lambda q, k, v: attention(q, k, v, window_size=2), "needs causal=True"),
    (lambda q, k, v: attention(q, k[:, :3], v[:, :3]), "cannot be grouped"),
    (lambda q, k, v: attention(q, k, v, dropout_p=1.5), "outside"),
    (lambda q, k, v: attention(q[0], k[0], v[0]), "4-D"),
    (lambda q, k, v: attention(q, k, v, _additive(_pad_mask()).requires_grad_(),
                               backend="flash"), "cannot run these inputs"),
])
def test_attention_errors(call, match):
    q, k, v = _qkv()
    with pytest.raises(OpError, match=match):
        call(q, k, v)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["auto", "math", "flash", "efficient", "cudnn"])
def test_attention_backends_on_cuda(backend):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 64, generator=g).cuda().half() for _ in range(3))
    f = [t.float() for t in (q, k, v)]
    try:
        out = attention(q, k, v, causal=True, backend=backend)
    except OpError as err:  # e.g. cuDNN attention needs a newer GPU / cuDNN
        pytest.skip(f"{backend} kernel unavailable here: {err}")
    torch.testing.assert_close(out.float(), attention_reference(*f, causal=True),
                               atol=2e-3, rtol=2e-3)
    mask = _pad_mask(64).cuda()
    try:  # a kernel that cannot take the mask must refuse it, never drop it
        out = attention(q, k, v, mask, backend=backend)
    except OpError:
        assert backend in ("flash", "cudnn")
        return
    torch.testing.assert_close(out.float(), attention_reference(*f, mask), atol=2e-3, rtol=2e-3)


# ---------------------------------------------------------------------- layer and fused layout
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (6, 2)])
def test_fuse_split_roundtrip_and_layout(heads, kv_heads):
    d, hidden = 3, 5
    q = torch.randn(heads * d, hidden)
    k, v = torch.randn(kv_heads * d, hidden), torch.randn(kv_heads * d, hidden)
    fused = fuse_qkv(q, k, v, heads, kv_heads, d)
    for a, b in zip(split_qkv(fused, heads, kv_heads, d), (q, k, v)):
        assert torch.equal(a, b)
    r = heads // kv_heads  # group g = [q heads g*r .. g*r+r-1 | k head g | v head g]
    g1 = fused[(r + 2) * d:2 * (r + 2) * d]
    assert torch.equal(g1[:r * d], q[r * d:2 * r * d])
    assert torch.equal(g1[r * d:(r + 1) * d], k[d:2 * d])
    assert torch.equal(g1[(r + 1) * d:], v[d:2 * d])


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_fused_qkv_shards_into_whole_heads(kv_heads):
    """Split a fused attention like TP would (qkv rows on axis 0, out_proj on axis 1): the
    per-rank partial outputs add up to the full output, so every rank got whole heads."""
    torch.manual_seed(0)
    full = SelfAttention(16, 4, num_kv_heads=kv_heads, fused_qkv=True, causal=True).eval()
    sep = SelfAttention(16, 4, num_kv_heads=kv_heads, causal=True).eval()
    with torch.no_grad():
        qw, kw, vw = split_qkv(full.qkv_proj.weight, 4, kv_heads, 4)
        qb, kb, vb = split_qkv(full.qkv_proj.bias, 4, kv_heads, 4)
        for lin, w, b in ((sep.q_proj, qw, qb), (sep.k_proj, kw, kb), (sep.v_proj, vw, vb)):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        sep.out_proj.load_state_dict(full.out_proj.state_dict())
    x = torch.randn(2, 5, 16)
    expected = full(x)
    torch.testing.assert_close(sep(x), expected, **TOL)
    world = 2
    partial = 0
    for rank in range(world):
        shard = SelfAttention(16, 4 // world, num_kv_heads=kv_heads // world, head_dim=4,
                              fused_qkv=True, causal=True).eval()
        rows = full.qkv_proj.weight.shape[0] // world
        cols = full.out_proj.weight.shape[1] // world
        with torch.no_grad():
            shard.qkv_proj.weight.copy_(full.qkv_proj.weight[rank * rows:(rank + 1) * rows])
            shard.qkv_proj.bias.copy_(full.qkv_proj.bias[rank * rows:(rank + 1) * rows])
            shard.out_proj.weight.copy_(full.out_proj.weight[:, rank * cols:(rank + 1) * cols])
            shard.out_proj.bias.zero_()
        partial = partial + shard(x)
    torch.testing.assert_close(partial + full.out_proj.bias, expected, **TOL)


def test_self_attention_errors():
    with pytest.raises(OpError, match="not divisible"):
        SelfAttention(10, 4)
    with pytest.raises(OpError, match="not a multiple"):
        SelfAttention(16, 4, num_kv_heads=3)
    with pytest.raises(OpError, match="cross attention"):
        SelfAttention(16, 4, fused_qkv=True, cross_attention=True)
    with pytest.raises(OpError, match="unknown attention backend"):
        SelfAttention(16, 4, backend="triton")
    with pytest.raises(OpError, match="no slapo attention adapter"):
        attention_from_hf(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------------- HF adapters
def _paths(fmt, n=2):
    return [fmt.format(i) for i in range(n)]


HF_PATHS = {
    "bert": _paths("bert.encoder.layer.{}.attention.self"),
    "roberta": _paths("roberta.encoder.layer.{}.attention.self"),
    "albert": ["albert.encoder.albert_layer_groups.0.albert_layers.0.attention"],
    "gpt2": _paths("transformer.h.{}.attn"),
    "gpt_neo": _paths("transformer.h.{}.attn.attention"),  # layer 0 global, layer 1 local
    "opt": _paths("model.decoder.layers.{}.self_attn"),
    "llama": _paths("model.layers.{}.self_attn"),
    "t5": [p for i in range(2) for p in (f"encoder.block.{i}.layer.0.SelfAttention",
                                         f"decoder.block.{i}.layer.0.SelfAttention",
                                         f"decoder.block.{i}.layer.1.EncDecAttention")],
}


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("family", list(HF_PATHS))
def test_hf_attention_swap(family, train):
    """Default (SDPA) HF models, padded batch, seq 12 (exercises GPT-Neo's window of 4)."""
    check_swap(family, HF_PATHS[family], attention_from_hf, train=train, seq=12)


@pytest.mark.parametrize("family", ["bert", "gpt2", "opt", "llama", "t5"])
def test_hf_attention_swap_eager_masks(family):
    """Eager HF attention: additive float masks, no SDPA on the reference side."""
    check_swap(family, HF_PATHS[family], attention_from_hf, seq=10,
               attn_implementation="eager")


@pytest.mark.parametrize("family", ["gpt2", "gpt_neo", "llama", "t5"])
def test_hf_attention_swap_unpadded(family):
    """No padding: HF passes no mask and relies on the module's own causal flag."""
    check_swap(family, HF_PATHS[family], attention_from_hf, seq=12, pad=False)


@pytest.mark.parametrize("family, fused", [("bert", True), ("opt", True), ("llama", True),
                                           ("gpt2", False)])
def test_hf_attention_swap_other_qkv_layout(family, fused):
    new = check_swap(family, HF_PATHS[family],
                     lambda m: attention_from_hf(m, fused_qkv=fused), seq=12)
    assert all(m.fused_qkv == fused for m in new.values())


def test_gpt_neo_local_layer_uses_its_window():
    new = check_swap("gpt_neo", HF_PATHS["gpt_neo"], attention_from_hf, seq=12)
    ops = [m.attn_op for m in new.values()]
    assert [op.window_size for op in ops] == [None, 4] and all(op.scale == 1.0 for op in ops)


def test_llama_gqa_heads_and_t5_bias():
    new = check_swap("llama", HF_PATHS["llama"][:1], attention_from_hf)
    m = new[HF_PATHS["llama"][0]]
    assert (m.num_heads, m.num_kv_heads, m.groups) == (4, 2, 2)
    new = check_swap("t5", HF_PATHS["t5"][:3], attention_from_hf)
    assert all(m.attn_op.scale == 1.0 for m in new.values())
    assert new["encoder.block.0.layer.0.SelfAttention"].relative_attention_bias is not None


def test_hf_attention_dropout_only_in_training():
    from slapo.testing import example_inputs, tiny_model

    import slapo

    model = tiny_model("gpt2", attn_pdrop=0.5)
    sch = slapo.create_schedule(model)
    for p in HF_PATHS["gpt2"]:
        sch[p].replace(attention_from_hf(sch[p].mod))
    ref = tiny_model("gpt2", attn_pdrop=0.5).eval()
    inputs = example_inputs("gpt2")
    with torch.no_grad():
        clean = ref(**inputs).logits
        torch.testing.assert_close(model.eval()(**inputs).logits, clean, **TOL)
        model.train()
        a, b = model(**inputs).logits, model(**inputs).logits
    assert not torch.allclose(a, clean) and not torch.allclose(a, b)


def test_cpu_dropout_kernel_is_used_within_and_restored():
    """``cpu_dropout_kernel`` swaps the CPU kernel of ``auto`` with dropout (nested: the
    innermost), not the kernel without dropout; the library's own kernel is back on exit."""
    from slapo.op import cpu_dropout_kernel

    q, k, v = _qkv(grad=False)
    seen = []

    def outer(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        seen.append(("outer", dropout_p, is_causal))
        return torch.zeros_like(q)

    def inner(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        seen.append(("inner", dropout_p, is_causal))
        return torch.ones_like(q)

    with cpu_dropout_kernel(outer):
        assert torch.equal(attention(q, k, v, dropout_p=0.1, causal=True), torch.zeros_like(q))
        with cpu_dropout_kernel(inner):
            assert torch.equal(attention(q, k, v, dropout_p=0.1), torch.ones_like(q))
        attention(q, k, v)  # no dropout: the kernel is not asked
    assert seen == [("outer", 0.1, True), ("inner", 0.1, False)]
    torch.manual_seed(0)
    out = attention(q, k, v, dropout_p=0.1)
    assert not torch.equal(out, torch.zeros_like(q)) and len(seen) == 2
    with pytest.raises(OpError, match="takes a function"):
        with cpu_dropout_kernel("fused"):
            pass
