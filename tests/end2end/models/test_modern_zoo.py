"""Today's families in the zoo (issue 27): the public checkpoints' parameter counts, the HF
configs built from the specs, FLOPs equal to torch's count (gated FFN, GQA, explicit head_dim,
mixture of experts counted at its active parameters), and CPU-scale sizes."""

import pytest
from torch.utils.flop_counter import FlopCounterMode

from end2end.models import (build_hf_config, build_model, count_parameters, get_model_spec,
                            make_inputs)
from end2end.models.flops import forward_flops

# (name, parameters of the published checkpoint (model cards / HF configs), tolerance)
PUBLIC = [
    ("Qwen/Qwen3-8B", 8.19e9, 0.01), ("mistralai/Mistral-7B-v0.3", 7.25e9, 0.01),
    ("google/gemma-3-4b-pt", 3.88e9, 0.01),  # the text model of Gemma 3 4B
    ("google/gemma-3-12b-pt", 11.77e9, 0.01),  # the text model of Gemma 3 12B
    ("microsoft/Phi-3-mini-4k-instruct", 3.82e9, 0.01),
    ("mistralai/Mixtral-8x7B-v0.1", 46.7e9, 0.01), ("Qwen/Qwen3-30B-A3B", 30.5e9, 0.01),
]
TINY = ["tiny/qwen3", "tiny/mistral", "tiny/gemma3", "tiny/phi3", "tiny/mixtral",
        "tiny/qwen3-moe"]


@pytest.mark.parametrize("name,expected,tol", PUBLIC, ids=[p[0] for p in PUBLIC])
def test_public_parameter_counts_on_meta(name, expected, tol):
    assert abs(count_parameters(build_model(name, device="meta")) / expected - 1) < tol
    assert get_model_spec(name).schedule == "auto"


def test_configs_carry_the_specs_shapes():
    qwen = build_hf_config("Qwen/Qwen3-8B")
    assert (qwen.head_dim, qwen.num_key_value_heads, qwen.intermediate_size) == (128, 8, 12288)
    gemma = build_hf_config("google/gemma-3-12b-pt")
    assert (type(gemma).__name__, gemma.head_dim, gemma.sliding_window) == (
        "Gemma3TextConfig", 256, 1024)
    assert build_hf_config("cpu/gemma3").head_dim == 64  # not Gemma's default 256
    mixtral = build_hf_config("mistralai/Mixtral-8x7B-v0.1")
    assert (mixtral.num_local_experts, mixtral.num_experts_per_tok) == (8, 2)
    moe = build_hf_config("Qwen/Qwen3-30B-A3B")
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size,
            moe.mlp_only_layers) == (128, 8, 768, [])
    assert type(build_hf_config("cpu/phi3")).base_model_tp_plan  # HF-TP and "auto" need one


@pytest.mark.parametrize("name", TINY)
def test_flops_match_the_flop_counter(name):
    """Matmul FLOPs of one forward as torch counts them; the experts run one by one
    ("eager" experts: FlopCounterMode does not count the default grouped_mm kernel)."""
    spec = get_model_spec(name)
    extra = {"experts_implementation": "eager"} if spec.is_moe else {}
    model = build_model(spec, seed=0, attn_implementation="eager", **extra)
    batch, seq = 2, 16
    with FlopCounterMode(display=False) as counter:
        model(**make_inputs(spec, batch, seq))
    assert counter.get_total_flops() / batch == forward_flops(spec, seq)


def test_moe_flops_count_the_active_experts_only():
    dense = get_model_spec("cpu/mistral")
    moe = get_model_spec("cpu/mixtral")  # 8 experts of half the FFN, 2 per token
    router = 2 * 512 * moe.hidden * moe.experts * moe.layers
    assert forward_flops(moe, 512) == forward_flops(dense, 512) + router


def test_cpu_models_are_sized_like_cpu_llama():
    llama = count_parameters(build_model("cpu/llama", device="meta"))
    for name in ("cpu/qwen3", "cpu/mistral", "cpu/gemma3", "cpu/phi3"):
        assert count_parameters(build_model(name, device="meta")) < 1.3 * llama, name
    for name in ("cpu/mixtral", "cpu/qwen3-moe"):  # 4x llama's FFN parameters, 1x active
        assert count_parameters(build_model(name, device="meta")) < 2.5 * llama, name


def test_paper_vocabularies_are_padded_for_tensor_parallelism():
    """BERT's 30522 (not divisible by 4 or 8) is padded as Megatron-LM pads (multiple of 128),
    for every system alike; divisible vocabularies stay as published."""
    from end2end.models.zoo import ZOO, padded_vocab

    assert ZOO["bert-xlarge"].vocab == 30592 and "vocab 30522 padded to 30592" in \
        ZOO["bert-xlarge"].note
    assert ZOO["gpt-10b"].vocab == 50304 and ZOO["gpt-10b"].note.startswith("reconstructed")
    assert ZOO["llama-7b"].vocab == 32000 and padded_vocab(32128) == 32128
    assert all(spec.vocab % 8 == 0 for spec in ZOO.values() if spec.vocab)
