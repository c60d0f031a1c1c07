"""Models by shape (issue 35, item 3): ``FAMILY:key=value,...`` and HF ``config.json`` paths as a
config line's MODEL, for the zoo, the FLOP count, the config grammar, the driver and the
simulator alike; mistakes are one line naming the key and the valid ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from end2end.models import build_model, count_parameters, get_model_spec
from end2end.models.flops import train_flops_per_sample
from end2end.models.shaped import ModelShapeError, valid_keys
from end2end.spec.config_file import ConfigLineError, parse_lines

GPT = "gpt2:layers=24,hidden=1920,heads=15,ffn=7680,vocab=51200"
LLAMA3 = "llama:layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256"
TINY_LLAMA = "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=256,max_positions=64"


def test_a_shape_overrides_the_family_base_and_keeps_the_rest():
    s = get_model_spec(GPT)
    assert (s.name, s.family, s.layers, s.hidden, s.heads, s.ffn, s.vocab) == (
        GPT, "gpt2", 24, 1920, 15, 7680, 51200)
    assert s.max_positions == 1024 and s.schedule == "gpt2"  # the base's (gpt2)
    llama = get_model_spec(LLAMA3)
    assert (llama.kv_heads, llama.gated_ffn, llama.schedule) == (8, True, "llama")
    # hidden without ffn keeps the base's ratio; heads without kv_heads: no GQA in the base
    s = get_model_spec("gpt2:hidden=1024,heads=16")
    assert (s.ffn, s.kv_heads) == (4096, 0)
    s = get_model_spec("llama:heads=16")
    assert s.kv_heads == 16
    # a zoo name as the prefix; a family written with a hyphen; padded vocabularies
    assert get_model_spec("llama-13b:layers=2").hidden == 5120
    assert get_model_spec("gpt-neo:layers=2").family == "gpt_neo"
    assert get_model_spec("gpt2:vocab=50257").vocab == 50304
    wrn = get_model_spec("wideresnet:block_layers=3/4/6/3,width_per_group=128")
    assert wrn.block_layers == (3, 4, 6, 3) and wrn.width_per_group == 128
    assert get_model_spec("t5:gated_ffn=true,layers=2").decoder_layers == 2


@pytest.mark.parametrize("text, message", [
    ("gpt2:hiden=3", "unknown key 'hiden' for family gpt2. Hint: valid keys: layers, hidden,"),
    ("gpt2:kv_heads=2", "unknown key 'kv_heads' for family gpt2"),
    ("gpt2:layers=x", "layers='x' is not a positive integer"),
    ("gpt2:layers=0", "layers='0' is not a positive integer"),
    ("gpt2:layers=2,layers=3", "key 'layers' given twice"),
    ("gpt2:layers", "'layers' is not key=value"),
    ("gtp2:layers=2", "unknown family 'gtp2'"),
    ("gpt2:hidden=100,heads=3", "hidden 100 is not divisible by heads 3"),
    ("llama:heads=32,kv_heads=5", "heads 32 is not a multiple of kv_heads 5"),
    ("gpt-neo:layers=3", "layers 3 is odd"),
    ("mixtral:experts=2,experts_per_token=4", "experts_per_token 4 exceeds experts 2"),
    ("t5:gated_ffn=maybe", "gated_ffn='maybe' is not a boolean"),
    ("wideresnet:block_layers=3/4/6", "block_layers='3/4/6' is not four positive integers"),
    ("no/such/config.json", "HF config no/such/config.json:"),
])
def test_mistakes_are_one_line_naming_the_key(text, message):
    with pytest.raises(ModelShapeError) as err:
        get_model_spec(text)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_valid_keys_follow_what_the_family_builds_from():
    assert "kv_heads" in valid_keys("llama") and "kv_heads" not in valid_keys("bert")
    assert "experts" in valid_keys("mixtral") and "experts" not in valid_keys("llama")
    assert "embedding_size" in valid_keys("albert") and "decoder_layers" in valid_keys("t5")


def test_shaped_models_build_with_their_parameter_count_on_meta():
    L, h, f, V, P = 24, 1920, 7680, 51200, 1024
    gpt = L * (4 * h * h + 2 * h * f + f + 9 * h) + V * h + P * h + 2 * h  # tied LM head
    assert count_parameters(build_model(GPT, device="meta")) == gpt
    L, h, heads, kv, f, V = 32, 4096, 32, 8, 14336, 128256
    d = h // heads
    layer = 2 * h * heads * d + 2 * h * kv * d + 3 * h * f + 2 * h
    assert count_parameters(build_model(LLAMA3, device="meta")) == L * layer + 2 * V * h + h
    assert count_parameters(build_model(LLAMA3, device="meta")) == 8_030_261_248  # Llama 3 8B


def test_flops_follow_the_shape():
    same = "gpt2:layers=12,hidden=768,heads=12,ffn=3072,vocab=50257"  # = the zoo's gpt2
    assert train_flops_per_sample(same, 1024) == train_flops_per_sample("gpt2", 1024)
    head = 3 * 2 * 1024 * 768 * 50304
    one = train_flops_per_sample("gpt2:layers=1", 1024) - head
    assert train_flops_per_sample("gpt2:layers=7", 1024) - head == pytest.approx(7 * one)
    narrow = train_flops_per_sample("gpt2:ffn=1536", 1024)
    assert narrow < train_flops_per_sample("gpt2", 1024)  # the FFN's real size
    assert train_flops_per_sample(GPT, 1024) != train_flops_per_sample("gpt2-medium", 1024)


def _hf_llama(tmp_path, **changes):
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, rope_theta=500000.0, **changes)
    config.save_pretrained(tmp_path)
    return tmp_path / "config.json"


def test_an_hf_config_json_is_a_model(tmp_path):
    path = _hf_llama(tmp_path)
    s = get_model_spec(str(path))
    assert (s.family, s.layers, s.hidden, s.heads, s.kv_heads, s.ffn, s.vocab) == (
        "llama", 2, 64, 4, 2, 96, 256)
    rope = dict(s.extra).get("rope_parameters") or {"rope_theta": dict(s.extra)["rope_theta"]}
    assert rope["rope_theta"] == 500000.0 and s.schedule == "llama"  # passed on to the model
    assert get_model_spec(str(tmp_path)).layers == 2  # the directory holding it
    built = build_model(str(path), device="meta")
    assert built.config.rope_parameters["rope_theta"] == 500000.0
    assert count_parameters(built) == count_parameters(build_model(TINY_LLAMA, device="meta"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model_type": "bloom", "vocab_size": 8}))
    with pytest.raises(ModelShapeError, match="model_type 'bloom' is not supported. Hint: "
                                              "model types: .*llama"):
        get_model_spec(str(bad))
    bad.write_text(json.dumps({"model_type": "llama", "vocab_size": 8}))
    with pytest.raises(ModelShapeError, match="no 'num_attention_heads'"):
        get_model_spec(str(bad))


def test_a_config_line_takes_a_shape_and_names_the_line_on_a_mistake():
    (line,) = parse_lines([f"slapo-megatron {TINY_LLAMA} 2 32 0 4 0"], "v.cfg")
    assert line.model == TINY_LLAMA
    with pytest.raises(ConfigLineError, match=r"^v.cfg:1: model 'gpt2:hiden=3': unknown key "
                                              r"'hiden' .* Hint: valid keys: layers"):
        parse_lines(["eager gpt2:hiden=3 1 32 0 4 0"], "v.cfg")
    with pytest.raises(ConfigLineError, match="exceeds the 64 positions .* add "
                                              "max_positions=128 to the shape"):
        parse_lines([f"eager {TINY_LLAMA} 1 128 0 4 0"], "v.cfg")


def _driver_run(results: str, model: str) -> int:
    from end2end.driver.bench import parse_args, run_bench

    return run_bench(parse_args(["--mode", "slapo", "--model", model, "--seq-len", "16",
                                 "--batch-size", "2", "--steps", "1", "--warmup", "1",
                                 "--gemm-seconds", "0.05", "--device", "cpu", "--ckpt", "0",
                                 "--results", results]))


@pytest.mark.timeout(300)
def test_the_driver_and_the_simulator_run_a_shaped_line(tmp_path, capsys):
    from end2end.results.store import read_results
    from end2end.simulate.engine.run import simulate_run
    from end2end.simulate.one import main as one_main
    from end2end.spec.config_file import make_run_spec
    from slapo.testing import run_distributed

    results = tmp_path / "r.tsv"
    assert run_distributed(_driver_run, 1, str(results), TINY_LLAMA, timeout=240) == [0]
    (row,) = read_results(results).rows
    assert row.status == "ok" and row.model == TINY_LLAMA and row.thrpt > 0
    params = count_parameters(build_model(TINY_LLAMA, device="meta"))
    assert row.per_gpu_param == pytest.approx(params / 1e6)  # millions per rank
    flops = train_flops_per_sample(TINY_LLAMA, 16)
    assert row.per_gpu_tflops == pytest.approx(row.thrpt * flops / 1e12, rel=1e-3)
    capsys.readouterr()
    assert one_main(["--mode", "slapo-megatron", "--model", TINY_LLAMA, "--gpus", "2",
                     "--seq-len", "16", "--batch-size", "4", "--ckpt", "0",
                     "--device", "v100-32gb"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["status"] == "sim" and line["samples_per_s"] > 0, line
    sim = simulate_run(make_run_spec("slapo-megatron", TINY_LLAMA, 2, 16, 0, 4, "0"),
                       "v100-32gb")
    assert sim["thrpt"] == pytest.approx(line["samples_per_s"])
    other = simulate_run(make_run_spec("slapo-megatron", TINY_LLAMA.replace(
        "layers=2", "layers=4"), 2, 16, 0, 4, "0"), "v100-32gb")
    forward = [r["extra"]["totals"][0]["flops_forward"] for r in (sim, other)]
    assert forward[1] > 1.5 * forward[0]  # the recorded step follows the shape
    assert sim["extra"]["train_flops_per_sample"] == train_flops_per_sample(TINY_LLAMA, 16)


@pytest.mark.parametrize("name, published", [("mpt-7b", 6658859008), ("mpt-13b", 12853954560),
                                             ("mpt-1b", 1315950592)])
def test_the_mpt_stand_ins_keep_mpts_settings_and_parameter_count(name, published):
    """The validation set's MPT stand-ins (docs/results/validation/models/): an HF GPT-2 config
    with MPT's dropout 0 and exact GELU passed on to the model (HF GPT-2's own defaults are
    dropout 0.1 and the tanh approximation), and llm-foundry's published NumParams."""
    path = str(Path(__file__).resolve().parents[3] / "docs/results/validation/models" /
               f"{name}.json")
    built = build_model(path, device="meta")
    c = built.config
    assert (c.resid_pdrop, c.embd_pdrop, c.attn_pdrop, c.activation_function) == (
        0.0, 0.0, 0.0, "gelu")
    assert count_parameters(built) == published


def test_the_nvidia_bert_stand_in_is_bert_large_with_its_own_attention():
    """The validation set's NVIDIA BERT stand-in (docs/results/validation/models/): the zoo's
    bert-large-uncased shape, with HF's eager attention (scores, softmax, dropout as separate
    kernels, as NVIDIA's modeling.py computes them) passed on to the model; the zoo's own model
    keeps SDPA."""
    path = str(Path(__file__).resolve().parents[3] / "docs/results/validation/models" /
               "bert-large-nvidia.json")
    built, zoo = build_model(path, device="meta"), build_model("bert-large-uncased", device="meta")
    assert built.config._attn_implementation == "eager"
    assert zoo.config._attn_implementation != "eager"
    assert count_parameters(built) == count_parameters(zoo)
