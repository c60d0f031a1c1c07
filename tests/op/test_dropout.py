"""slapo.op.dropout: the cheap-mask dropout is a dropout (drop rate, unbiased scale, backward =
the same mask, seeded, eval/p=0 identities), attention with dropout on the CPU uses it, and the
model schedules swap every nn.Dropout for it (``fast_dropout``), per-rank masks where T5's FFN
activation is sharded."""

import math

import pytest
import torch
from torch import nn

import slapo
from slapo.model_schedule import apply_schedule
from slapo.op.attention import AttentionOp
from slapo.op.dropout import Dropout, dropout, keep_mask
from slapo.runtime.forward_wrap import has_forward_wrapper
from slapo.testing import run_distributed, tiny_model

N = 1 << 20


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drop_rate_is_p_and_the_output_is_unbiased(p):
    torch.manual_seed(0)
    x = torch.ones(N, requires_grad=True)
    out = dropout(x, p)
    dropped = (out == 0).double().mean().item()
    sigma = math.sqrt(p * (1 - p) / N)
    assert abs(dropped - p) < 6 * sigma, (dropped, p)
    kept = out[out != 0]
    scale = kept[0].item()
    rounded = round(p * 2 ** 16) / 2 ** 16  # the drop probability, in steps of 2**-16
    assert abs(scale * (1 - rounded) - 1) < 1e-6 and torch.all(kept == scale)
    assert abs(out.double().mean().item() - 1.0) < 6 * sigma * scale  # E[out] = x
    out.sum().backward()
    assert torch.equal(x.grad, out.detach())  # the backward applies the forward's mask


def test_keep_mask_shape_and_rate():
    torch.manual_seed(1)
    mask = keep_mask(torch.Size([64, 3, 1024]), 0.25)
    assert mask.dtype == torch.bool and mask.shape == (64, 3, 1024)
    sigma = math.sqrt(0.25 * 0.75 / mask.numel())
    assert abs((~mask).double().mean().item() - 0.25) < 6 * sigma
    assert keep_mask(torch.Size([0, 4]), 0.5).shape == (0, 4)


def test_identities_limits_errors_and_dtypes():
    x = torch.randn(4, 8)
    assert dropout(x, 0.3, training=False) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    with pytest.raises(ValueError, match="between 0 and 1"):
        dropout(x, 1.5)
    half = dropout(torch.randn(64, 64, dtype=torch.bfloat16), 0.5)
    assert half.dtype == torch.bfloat16
    torch.manual_seed(3)
    a = dropout(x, 0.5)
    torch.manual_seed(3)
    assert torch.equal(a, dropout(x, 0.5))  # seeded: reproducible
    assert not torch.equal(a, dropout(x, 0.5))  # the stream advances


def test_module_is_a_drop_in_nn_dropout():
    old = nn.Dropout(0.2).eval()
    new = Dropout.from_module(old)
    assert isinstance(new, nn.Dropout) and new.p == 0.2 and not new.training
    x = torch.randn(16, 16)
    assert new(x) is x
    new.train()
    assert (new(x) == 0).any()


def test_cpu_attention_with_dropout_uses_the_cheap_mask():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 8) for _ in range(3))
    op = AttentionOp(dropout=0.5).train()
    torch.manual_seed(5)
    got = op(q, k, v)
    torch.manual_seed(5)  # the same maths with the same mask drawn by hand
    probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), dim=-1)
    want = dropout(probs, 0.5) @ v
    torch.testing.assert_close(got, want)


def _dropout_paths(model):
    return sorted(p for p, m in model.named_modules() if isinstance(m, nn.Dropout) and m.p > 0)


@pytest.mark.parametrize("family", ["bert", "t5", "gpt_neo"])
def test_schedules_swap_every_dropout_unless_turned_off(family):
    ref = tiny_model(family, **_DROPOUT[family])
    want = _dropout_paths(ref)
    assert want
    sch = apply_schedule(tiny_model(family, **_DROPOUT[family]), family)
    swapped = [p for p, m in sch.mod.named_modules() if type(m) is Dropout]
    assert swapped and not [p for p, m in sch.mod.named_modules() if type(m) is nn.Dropout
                            and m.p > 0]
    kept = apply_schedule(tiny_model(family, **_DROPOUT[family]), family, fast_dropout=False)
    assert not [m for m in kept.mod.modules() if type(m) is Dropout]


_DROPOUT = {"bert": dict(hidden_dropout_prob=0.1), "t5": dict(dropout_rate=0.1),
            "gpt_neo": dict(resid_dropout=0.1, embed_dropout=0.1)}


def _t5_tp_ffn_dropout():
    slapo.set_random_seed(0, tp_rank=torch.distributed.get_rank())
    sch = apply_schedule(tiny_model("t5", dropout_rate=0.1), "t5")
    path = "encoder.block.0.layer.1.DenseReluDense.dropout"
    mod = sch[path].mod
    x = torch.ones(4, 64)
    torch.manual_seed(0)  # the same default stream on both ranks ...
    return type(mod) is Dropout, has_forward_wrapper(mod, "fork_rng"), mod(x)


def test_t5_tp_ffn_dropout_draws_per_rank_masks():
    (swapped0, forked0, out0), (swapped1, forked1, out1) = run_distributed(_t5_tp_ffn_dropout, 2)
    assert swapped0 and swapped1 and forked0 and forked1
    assert not torch.equal(out0, out1)  # ... yet each rank's mask differs (forked stream)
