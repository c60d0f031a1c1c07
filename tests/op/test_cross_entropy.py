"""Vocab-parallel cross-entropy, alone and behind a vocab-parallel embedding + LM head."""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import slapo
from slapo.op import cross_entropy
from slapo.op.cross_entropy import VocabParallelCausalLMLoss, vocab_parallel_cross_entropy
from slapo.sharding import check_layouts
from slapo.testing import example_inputs, run_distributed, tiny_model
from tests.sharding.helpers import train_and_compare

CASES = [dict(), dict(label_smoothing=0.1), dict(reduction="sum"),
         dict(reduction="none", label_smoothing=0.2)]
# the same cases in the memory-lean form, its blocks of rows smaller than the batch
CASES += [dict(c, lean=True) for c in CASES]


def _targets():
    t = torch.tensor([0, 4, 5, 9, -100, 3, 7, -100, 2, 5])  # shard edges of a 10-word vocab
    return t.view(2, 5)


def _compare(logits_full, target, rank, world, **kw):
    v = logits_full.shape[-1] // world
    full = logits_full.detach().clone().requires_grad_()
    local = logits_full[..., rank * v:(rank + 1) * v].detach().clone().requires_grad_()
    want = F.cross_entropy(full.reshape(-1, full.shape[-1]), target.reshape(-1),
                           ignore_index=-100, **{k: v for k, v in kw.items() if k != "lean"})
    got = vocab_parallel_cross_entropy(local, target, **kw)
    torch.testing.assert_close(got, want.view_as(got), rtol=1e-5, atol=1e-6)
    w = torch.rand_like(want) + 0.5
    (want * w).sum().backward()
    (got * w.view_as(got)).sum().backward()
    torch.testing.assert_close(local.grad, full.grad[..., rank * v:(rank + 1) * v],
                               rtol=1e-5, atol=1e-6)


@pytest.fixture(autouse=True)
def _small_lean_blocks(monkeypatch):
    """Blocks of 3 rows of a 10-word vocabulary: the lean path's loops run several blocks."""
    monkeypatch.setattr(cross_entropy, "LEAN_BLOCK_ELEMENTS", 30)


@pytest.mark.parametrize("kw", CASES)
def test_single_process_equals_cross_entropy(kw):
    _compare(torch.randn(2, 5, 10) * 3, _targets(), 0, 1, **kw)


def _saved_by(fn) -> list:
    """(dtype, shape) of every tensor ``fn``'s autograd graph saves."""
    saved = []

    def pack(t):
        saved.append((t.dtype, tuple(t.shape)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return saved


def test_lean_keeps_no_full_vocabulary_fp32_tensor_and_matches_in_bf16():
    """``lean``: the bf16 logits and per-token vectors are all it saves (the default saves
    the fp32 softmax); its bf16 gradient equals the default's rounded to bf16."""
    logits = (torch.randn(4, 7, 10) * 3).bfloat16().requires_grad_()
    target = torch.randint(0, 10, (4, 7))
    target[0, :2] = -100
    full = [s for s in _saved_by(lambda: vocab_parallel_cross_entropy(logits, target))
            if s[1] == (28, 10)]
    lean = [s for s in _saved_by(lambda: vocab_parallel_cross_entropy(logits, target,
                                                                      lean=True))
            if s[1] == (28, 10)]
    assert (torch.float32, (28, 10)) in full
    assert lean == [(torch.bfloat16, (28, 10))]
    grads = []
    for lean_ in (False, True):
        loss = vocab_parallel_cross_entropy(logits, target, lean=lean_, label_smoothing=0.1)
        grads.append((loss, *torch.autograd.grad(loss, logits)))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-6, atol=1e-6)
    assert grads[1][1].dtype == torch.bfloat16
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-2, atol=1e-4)


def test_float64_logits_stay_float64():
    """fp64 verification needs the loss in fp64 (fp16/bf16 logits are computed in fp32)."""
    logits = (torch.randn(2, 5, 10, dtype=torch.float64) * 3).requires_grad_()
    got = vocab_parallel_cross_entropy(logits, _targets(), reduction="none")
    want = F.cross_entropy(logits.view(-1, 10), _targets().view(-1), reduction="none")
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want.view_as(got), rtol=1e-12, atol=1e-12)
    (g,) = torch.autograd.grad(got.sum(), logits)
    (w,) = torch.autograd.grad(want.sum(), logits)
    assert g.dtype == torch.float64
    torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_cross_entropy_errors():
    with pytest.raises(slapo.SlapoError, match=r"do not match targets"):
        vocab_parallel_cross_entropy(torch.randn(2, 5, 10), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(slapo.SlapoError, match=r"unknown reduction 'avg'"):
        vocab_parallel_cross_entropy(torch.randn(3, 10), torch.zeros(3, dtype=torch.long),
                                     reduction="avg")


def _vocab_parallel():
    cross_entropy.LEAN_BLOCK_ELEMENTS = 30  # spawned: the fixture does not reach here
    rank = dist.get_rank()
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 10) * 3
    for kw in CASES:
        _compare(logits, _targets(), rank, 2, **kw)

    # embedding + LM head (tied) vocab-parallel, loss without gathering the logits
    ref = tiny_model("gpt2", use_cache=False)
    model = copy.deepcopy(ref)
    sch = slapo.create_schedule(model)
    sch["lm_head"].shard("weight", axis=0)  # ties: wte becomes a vocab-parallel embedding
    sch["transformer.wte"].sync("fwd_post", "all_reduce")
    sch["lm_head"].sync("bwd_post", "all_reduce")
    model.loss_function = VocabParallelCausalLMLoss()
    assert check_layouts(sch) == []
    inputs = example_inputs("gpt2")
    inputs["input_ids"][0, :3] = torch.tensor([64, 0, 63])  # both shard starts, one shard end
    inputs["labels"] = inputs["input_ids"].clone()
    inputs["labels"][1, 2] = -100

    def out_fn(out):
        logits = out.logits
        if logits.shape[-1] == 128:
            logits = logits[..., rank * 64:(rank + 1) * 64]
        return {"loss": out.loss, "logits": logits}

    train_and_compare(ref, model, inputs, steps=3, out_fn=out_fn, rtol=1e-4, atol=1e-5)
    return True


def test_vocab_parallel_loss_and_embedding_match_reference():
    assert run_distributed(_vocab_parallel, 2) == [True, True]
