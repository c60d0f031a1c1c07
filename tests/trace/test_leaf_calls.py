"""Leaf callables (``slapo.trace.leaf_calls``): a callable attribute whose class sets
``_slapo_leaf`` is one opaque graph node (as the vocab-parallel loss, which runs collectives,
must be); without the flag the tracer follows it, which silently drops an autograd function's
own backward (as a collective's ``..._all_reduce_backward``). The 4-rank pipeline test
(tests/pipeline/test_tp_pipeline.py) traces the real vocab-parallel loss."""

import pytest
import torch
from torch import nn

from slapo.trace.leaf_calls import LeafCall, is_leaf_callable
from slapo.trace.tracer import trace_module


class _ScaleSumBackward(torch.autograd.Function):
    """``x * factor`` forward; backward 3x the true gradient (a stand-in for a collective's
    backward that sums over 3 ranks): fx cannot record it, it runs ``forward`` on proxies and
    keeps only the forward maths."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x * factor

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor * 3, None


class OpaqueLoss:
    """A loss callable the tracer must not follow (its class is a leaf)."""

    _slapo_leaf = True

    def __init__(self, factor: float):
        self.factor = factor

    def __call__(self, logits, labels, ignore_index=-100):
        scaled = _ScaleSumBackward.apply(logits, self.factor)
        return nn.functional.cross_entropy(scaled, labels, ignore_index=ignore_index)


class TransparentLoss(OpaqueLoss):
    _slapo_leaf = False


class Head(nn.Module):
    def __init__(self, loss):
        super().__init__()
        self.proj = nn.Linear(8, 5)
        self._loss_function = loss  # as HF's ``loss_function`` setter stores it

    def forward(self, x, labels):
        logits = self.proj(x)
        return logits, self._loss_function(logits, labels=labels, ignore_index=-1)


def _inputs(batch: int = 6):
    gen = torch.Generator().manual_seed(batch)
    return torch.randn(batch, 8, generator=gen), torch.randint(0, 5, (batch,), generator=gen)


def test_leaf_callable_is_one_node_and_trains_like_eager():
    torch.manual_seed(0)
    ref = Head(OpaqueLoss(2.0))
    model = Head(OpaqueLoss(2.0))
    model.load_state_dict(ref.state_dict())
    loss_fn = model._loss_function
    gm, _ = trace_module(model, (_inputs(), {}), lambda m, q: True)
    calls = [n for n in gm.graph.nodes if isinstance(n.target, LeafCall)]
    assert len(calls) == 1 and calls[0].target.fn is loss_fn
    assert calls[0].kwargs["ignore_index"] == -1
    assert model._loss_function is loss_fn  # the attribute is put back after tracing
    for batch in (6, 3):  # the traced shape and another
        x, y = _inputs(batch)
        (ref_logits, ref_loss), (logits, loss) = ref(x, y), gm(x, y)
        torch.testing.assert_close(logits, ref_logits)
        torch.testing.assert_close(loss, ref_loss)
        ref_loss.backward()
        loss.backward()
        torch.testing.assert_close(gm.proj.weight.grad, ref.proj.weight.grad)
        ref.zero_grad()
        gm.zero_grad()


def _weight_grad(model, traced, x, y):
    _, loss = traced(x, y)
    loss.backward()
    return model.proj.weight.grad


def test_without_the_flag_the_tracer_drops_the_custom_backward():
    x, y = _inputs()
    grads = {}
    for cls in (OpaqueLoss, TransparentLoss):
        torch.manual_seed(0)
        eager = Head(cls(2.0))
        torch.manual_seed(0)
        model = Head(cls(2.0))
        traced, _ = trace_module(model, ((x, y), {}), lambda m, q: True)
        grads[cls] = (_weight_grad(eager, eager, x, y), _weight_grad(traced, traced, x, y))
    torch.testing.assert_close(*grads[OpaqueLoss])
    eager_grad, traced_grad = grads[TransparentLoss]
    torch.testing.assert_close(traced_grad * 3, eager_grad)  # the backward was lost
    with pytest.raises(AssertionError):
        torch.testing.assert_close(traced_grad, eager_grad)


def test_what_counts_as_a_leaf_callable():
    assert is_leaf_callable(OpaqueLoss(1.0))
    assert not is_leaf_callable(TransparentLoss(1.0))
    assert not is_leaf_callable(OpaqueLoss)  # the class itself is not called as a loss
    assert not is_leaf_callable(nn.Linear(2, 2))  # modules are leaves by the module rules
    from slapo.op.cross_entropy import VocabParallelCausalLMLoss

    assert is_leaf_callable(VocabParallelCausalLMLoss())
