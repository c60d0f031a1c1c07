"""What the recipes change besides the modules: GPT-Neo's SDPA masks (none without padding, so
global layers take the kernels' causal path and local layers the block-by-block path), the
native GeLU, greedy generation with the default KV cache, and the refusal of static caches."""

import copy
import sys

import pytest
import torch
from torch import nn

from slapo.errors import OpError
from slapo.model_schedule import apply_schedule
from slapo.testing import example_inputs, tiny_model

from .helpers import compare_training

core = sys.modules["slapo.op.attention"]


@pytest.fixture
def attention_calls(monkeypatch):
    """Every core attention call as (mask is None, window_size), and the blocked-path calls."""
    calls = {"attention": [], "blocked": []}
    real, real_blocked = core.attention, core._blocked_local_attention

    def spy(q, k, v, attn_mask=None, **kw):
        calls["attention"].append((attn_mask is None, kw.get("window_size")))
        return real(q, k, v, attn_mask, **kw)

    def spy_blocked(*args, **kw):
        calls["blocked"].append(args[4])
        return real_blocked(*args, **kw)

    monkeypatch.setattr(core, "attention", spy)
    monkeypatch.setattr(core, "_blocked_local_attention", spy_blocked)
    return calls


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_gpt_neo_long_sequence_trains_like_hf(padded, attention_calls):
    ref = tiny_model("gpt_neo")
    model = copy.deepcopy(ref)
    apply_schedule(model, "gpt_neo")
    inputs = example_inputs("gpt_neo", seq=18)  # window 4: four and a half windows
    if not padded:
        inputs["attention_mask"][:] = 1
    compare_training(ref, model, inputs)
    windows = [w for _, w in attention_calls["attention"]]
    assert windows == [None, 4]  # a global and a local layer
    assert all(none for none, _ in attention_calls["attention"]) != padded
    assert attention_calls["blocked"] == ([] if padded else [4])


def test_gpt_neo_activation_becomes_one_kernel():
    model = tiny_model("gpt_neo")
    assert type(model.transformer.h[0].mlp.act).__name__ == "NewGELUActivation"
    apply_schedule(model, "gpt_neo")
    assert all(isinstance(h.mlp.act, nn.GELU) and h.mlp.act.approximate == "tanh"
               for h in model.transformer.h)


@pytest.mark.parametrize("family", ["gpt_neo", "gpt2", "opt", "llama"])
def test_greedy_generation_matches_hf(family):
    ref = tiny_model(family).eval()
    model = copy.deepcopy(ref)
    apply_schedule(model, family)
    prompt = example_inputs(family, seq=6)["input_ids"]
    kw = dict(max_new_tokens=8, do_sample=False, use_cache=True, pad_token_id=0)
    assert torch.equal(model.generate(prompt, **kw), ref.generate(prompt, **kw))


def test_static_cache_is_refused():
    model = tiny_model("gpt_neo").eval()
    apply_schedule(model, "gpt_neo")
    prompt = example_inputs("gpt_neo", seq=6)["input_ids"]
    with pytest.raises(OpError, match="DynamicCache"):
        model.generate(prompt, max_new_tokens=2, do_sample=False, pad_token_id=0,
                       cache_implementation="static")
