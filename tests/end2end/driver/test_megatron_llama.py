"""The megatron-core LLaMA baseline computes what HuggingFace computes: a HF LLaMA's (Mistral's,
Qwen2's) weights mapped into megatron-core's GPT (fused grouped QKV, SwiGLU fc1 = gate then up)
give the same loss and, mapped the same way, the same gradients, on 1 rank and at TP 2 on 2 gloo
ranks; trained with SGD under the megatron runtime, the losses follow HF's step by step."""

import pytest
import torch

from slapo.errors import ConfigError
from slapo.runtime.distributed import teardown
from slapo.testing import run_distributed
from slapo.testing.models import tiny_plan_config

SEQ, STEPS = 48, 3
GRAD_TOL = 1e-4  # max |grad difference| / max |HF gradient|, per parameter
ONE_RANK_MODELS = ("cpu/llama", "tiny/mistral", "tiny/qwen2")
TP2_MODELS = ONE_RANK_MODELS + ("tiny/llama-1kv",)  # + fewer query groups than TP ranks


def _hf_model(name: str, seed: int = 0):
    import transformers as tf

    from end2end.models.build import build_hf_config

    if name == "cpu/llama":
        config = build_hf_config("cpu/llama")
    elif name == "tiny/llama-1kv":  # one key/value head: fewer query groups than TP ranks
        config = tiny_plan_config("llama", num_key_value_heads=1)
    elif name == "tiny/mistral":
        config = tiny_plan_config("mistral", sliding_window=None)
    else:  # tiny/qwen2: q/k/v biases, tied embeddings
        config = tiny_plan_config("qwen2", tie_word_embeddings=True)
    torch.manual_seed(seed)
    return tf.AutoModelForCausalLM.from_config(config).train()


def _batch(vocab: int, seed: int = 1):
    """Two sequences; the second right-padded (padding masked, its labels -100)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (2, SEQ), generator=g)
    mask = torch.ones_like(ids)
    mask[1, SEQ - 7:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def _megatron_twin(hf):
    """The megatron-core model of ``hf``'s config at the world's TP size, with ``hf``'s weights."""
    import torch.distributed as dist

    from end2end.driver.baselines.megatron_core import build_megatron_model, load_hf_llama_weights

    model = build_megatron_model(hf.config, dist.get_world_size())
    load_hf_llama_weights(model, hf)
    return model


def _loss_and_grads(name: str):
    """HF and megatron losses, and the worst relative gradient difference (in megatron's layout)."""
    from megatron.core import parallel_state as ps

    from end2end.driver.baselines.megatron_core import hf_llama_to_megatron, megatron_loss_fn

    hf = _hf_model(name)
    model = _megatron_twin(hf)
    batch = _batch(hf.config.vocab_size)
    hf_loss = hf(**batch).loss
    hf_loss.backward()
    mg_loss = megatron_loss_fn(hf.config)(model, batch)
    mg_loss.backward()
    expected = hf_llama_to_megatron({n: p.grad for n, p in hf.named_parameters()}, hf.config,
                                    ps.get_tensor_model_parallel_rank(),
                                    ps.get_tensor_model_parallel_world_size())
    worst = {n: ((p.grad - expected[n]).abs().max() / expected[n].abs().max()).item()
             for n, p in model.named_parameters()}
    teardown()
    return {"hf": hf_loss.item(), "megatron": mg_loss.item(), "grad": worst}


def _swapped_gate_up_loss() -> float:
    """The megatron loss when gate and up are swapped in the mapping: must differ from HF's."""
    from end2end.driver.baselines.megatron_core import megatron_loss_fn

    hf = _hf_model("cpu/llama")
    with torch.no_grad():
        for layer in hf.model.layers:
            gate, up = layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight
            tmp = gate.clone()
            gate.copy_(up)
            up.copy_(tmp)
    swapped = _megatron_twin(hf)
    loss = megatron_loss_fn(hf.config)(swapped, _batch(hf.config.vocab_size)).item()
    teardown()
    return loss


def _training(name: str):
    """Losses of STEPS SGD steps: HF in plain PyTorch, megatron under its runtime."""
    from slapo.dialects.megatron import MegatronRuntime

    from end2end.driver.baselines.megatron_core import megatron_loss_fn

    hf = _hf_model(name)
    model = _megatron_twin(hf)
    batches = [_batch(hf.config.vocab_size, seed=10 + i) for i in range(STEPS)]
    opt = torch.optim.SGD(hf.parameters(), lr=0.1)
    hf_losses = []
    for batch in batches:
        opt.zero_grad()
        loss = hf(**batch).loss
        loss.backward()
        opt.step()
        hf_losses.append(loss.item())
    runtime = MegatronRuntime(model, torch.optim.SGD(model.parameters(), lr=0.1),
                              megatron_loss_fn(hf.config))
    mg_losses = [runtime.train_step(batch) for batch in batches]
    teardown()
    return {"hf": hf_losses, "megatron": mg_losses}


def _one_rank():
    out = {name: _loss_and_grads(name) for name in ONE_RANK_MODELS}
    out["swapped"] = _swapped_gate_up_loss()
    return out


def _two_ranks():
    out = {name: _loss_and_grads(name) for name in TP2_MODELS}
    out["training"] = _training("cpu/llama")
    return out


def _check_same(result, name):
    torch.testing.assert_close(result["megatron"], result["hf"], rtol=1e-5, atol=1e-6,
                               msg=f"{name}: megatron loss differs from HF")
    bad = {n: d for n, d in result["grad"].items() if not d < GRAD_TOL}
    assert not bad, f"{name}: gradients differ from HF's (relative): {bad}"


def test_megatron_llama_matches_hf_on_one_rank():
    out = run_distributed(_one_rank, 1)[0]
    for name in ONE_RANK_MODELS:
        _check_same(out[name], name)
    # the check can fail: a wrong SwiGLU order gives another loss
    assert abs(out["swapped"] - out["cpu/llama"]["hf"]) > 1e-3, out["swapped"]


def test_megatron_llama_matches_hf_at_tp2():
    results = run_distributed(_two_ranks, 2)
    for rank, out in enumerate(results):
        for name in TP2_MODELS:
            _check_same(out[name], f"{name} (TP 2, rank {rank})")
        train = out["training"]
        torch.testing.assert_close(train["megatron"], train["hf"], rtol=1e-5, atol=1e-5)
        assert train["hf"][-1] < train["hf"][0], train


def _cpu_llama(**overrides):
    from end2end.models.build import build_hf_config

    return build_hf_config("cpu/llama", **overrides)


@pytest.mark.parametrize("overrides, match", [
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
     "RoPE type 'linear'"),
])
def test_unsupported_llama_configs_are_refused(overrides, match):
    from end2end.driver.baselines.megatron_core import transformer_config

    with pytest.raises(ConfigError, match=match):
        transformer_config(_cpu_llama(**overrides))


def test_mistral_sliding_window_and_unknown_family_are_refused():
    from end2end.driver.baselines.megatron_core import family_of, transformer_config

    with pytest.raises(ConfigError, match="sliding_window=16 < max_position_embeddings"):
        transformer_config(tiny_plan_config("mistral", sliding_window=16))
    with pytest.raises(ConfigError, match="no megatron-core baseline for model type 'opt'"):
        family_of(tiny_plan_config("opt"))
    assert family_of(_cpu_llama()) == "llama"
