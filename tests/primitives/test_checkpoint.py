import pytest
import torch
from torch import nn

import slapo
from slapo.testing import MLP, assert_same_training, example_inputs, tiny_model

LAYERS = {"bert": "bert.encoder.layer", "gpt2": "transformer.h", "llama": "model.layers"}
DROPOUT = {"bert": dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
           "gpt2": dict(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, use_cache=False),
           "llama": dict(attention_dropout=0.1, use_cache=False)}


def saved_bytes(model, inputs):
    """Bytes of tensors autograd saves for backward during one forward."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(**inputs)
    return total[0], out


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_checkpoint_layers_same_numerics_under_dropout(family):
    ref = tiny_model(family, **DROPOUT[family])
    model = tiny_model(family, **DROPOUT[family])
    keys_before = list(model.state_dict())
    sch = slapo.create_schedule(model)
    for i in range(2):
        sch[f"{LAYERS[family]}.{i}"].checkpoint()
    assert list(model.state_dict()) == keys_before  # paths and keys unchanged
    inputs = example_inputs(family)
    assert_same_training(ref, model, inputs, seed=7, atol=1e-6, rtol=1e-6)
    # and it really stops saving the layers' activations
    ref_bytes, _ = saved_bytes(ref, inputs)
    ckpt_bytes, _ = saved_bytes(model, inputs)
    assert ckpt_bytes < 0.7 * ref_bytes, (ckpt_bytes, ref_bytes)


class KwModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, *, scale=1.0, mask=None):
        y = torch.nn.functional.dropout(self.lin(x), 0.5, self.training) * scale
        return y if mask is None else y * mask


def test_checkpoint_with_keyword_arguments():
    ref, model = KwModule(), KwModule()
    model.load_state_dict(ref.state_dict())
    sch = slapo.create_schedule(model)
    sch.checkpoint()
    x = torch.randn(4, 8, requires_grad=True)
    mask = (torch.rand(4, 8) > 0.3).float()
    outs, grads = [], []
    for m in (ref, model):
        torch.manual_seed(3)
        xi = x.detach().clone().requires_grad_()
        out = m(xi, scale=2.0, mask=mask)
        out.pow(2).sum().backward()
        outs.append(out)
        grads.append((xi.grad, m.lin.weight.grad))
    torch.testing.assert_close(outs[1], outs[0])
    torch.testing.assert_close(grads[1], grads[0])


class ForkedDropout(nn.Module):
    """Dropout drawn from slapo's model-parallel RNG stream."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        with slapo.get_rng_tracker().fork():
            return torch.nn.functional.dropout(self.lin(x), 0.5, True)


def test_checkpoint_restores_tracker_streams():
    ref, model = ForkedDropout(), ForkedDropout()
    model.load_state_dict(ref.state_dict())
    slapo.create_schedule(model).checkpoint()
    results = []
    for m in (ref, model):
        slapo.set_random_seed(123, tp_rank=1)
        x = torch.randn(4, 8)
        out = m(x)
        out.sum().backward()
        results.append((out.detach(), m.lin.weight.grad.clone()))
        # the stream advanced exactly as without checkpointing
        results[-1] += (slapo.get_rng_tracker().get_states()["model-parallel-rng"]["cpu"],)
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=0)
    slapo.get_rng_tracker().reset()


def test_checkpoint_twice_is_an_error():
    sch = slapo.create_schedule(MLP())
    sch["fc1"].checkpoint()
    with pytest.raises(slapo.CheckpointError, match=r"on 'fc1'.*already checkpointed"):
        sch["fc1"].checkpoint()


def test_checkpointed_model_deepcopies():
    import copy

    model = MLP(dropout=0.1)
    slapo.create_schedule(model)["fc1"].checkpoint()
    clone = copy.deepcopy(model)
    x = torch.randn(2, 16)
    torch.manual_seed(0)
    a = model(x)
    torch.manual_seed(0)
    b = clone(x)
    torch.testing.assert_close(a, b)
    # the clone's forward runs the clone's weights, not the original's
    with torch.no_grad():
        clone.fc1.weight.zero_()
        clone.fc1.bias.zero_()
    torch.manual_seed(0)
    assert not torch.allclose(clone(x), a)


def test_checkpoint_with_kv_cache_is_an_error():
    model = tiny_model("gpt2", use_cache=True)
    slapo.create_schedule(model)["transformer.h.0"].checkpoint()
    with pytest.raises(slapo.CheckpointError, match="KV cache.*Hint: train with use_cache=False"):
        model(**example_inputs("gpt2"))
