"""Every mode trains without HF's KV cache: with ``use_cache`` on (HF's default), a plain
training call of a causal LM appends each layer's keys and values to a cache that lives until
the forward returns, memory no training framework keeps (the simulator saw it as two extra
hidden-sized activations per layer of every baseline run)."""

import torch

from end2end.driver.runner import RunnerRequest, prepare_hf_model, without_kv_cache
from end2end.spec.modes import get_mode
from slapo.testing import example_inputs, tiny_config, tiny_model


def _request(mode: str, config) -> RunnerRequest:
    return RunnerRequest(get_mode(mode), config, None, None, None, None, 1, 0, None, 1, 1, None)


def test_a_baseline_model_keeps_no_cache_and_computes_the_same_loss():
    config = tiny_config("gpt2")
    assert config.use_cache  # HF's default: the test can fail
    model = prepare_hf_model(_request("eager", config))
    assert not model.config.use_cache
    batch = example_inputs("gpt2", batch=2, seq=16)
    out = model(**batch)
    assert out.past_key_values is None
    reference = tiny_model("gpt2")
    reference.load_state_dict(model.state_dict())
    with_cache = reference(**batch)
    assert with_cache.past_key_values is not None
    torch.testing.assert_close(out.loss, with_cache.loss, rtol=0, atol=0)


def test_every_config_a_model_holds_is_turned_off():
    model = tiny_model("t5")  # the decoder stack holds a config of its own
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    assert len(configs) > 1 and any(c.use_cache for c in configs.values())
    without_kv_cache(model)
    assert not any(getattr(c, "use_cache", False) for c in configs.values())
