"""Every registered model schedule trains exactly like the unscheduled model.

TP=1 (in process) and TP=2 (two gloo ranks, one spawn for all families): outputs and the
gradient of every original parameter match, with and without activation checkpointing, plus
sequence parallelism (GPT-2, GPT-Neo, LLaMA), unfused QKV and bias+GeLU fusion variants.
"""

import copy
import warnings

import pytest
import torch

import slapo
from slapo.errors import ConfigError
from slapo.runtime.forward_wrap import has_forward_wrapper
from slapo.model_schedule import (apply_schedule, checkpoint_layer_ids, list_model_schedules,
                                  supports_sequence_parallel)
from slapo.op import SelfAttention
from slapo.sharding import get_shard_spec
from slapo.testing import example_inputs, run_distributed, tiny_model
from tests.model_schedule.helpers import check_family, compare_training, wideresnet

FAMILIES = ("bert", "roberta", "albert", "gpt2", "gpt_neo", "opt", "t5", "llama", "wideresnet")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*backward hooks to be called.*")
    yield
    torch.set_num_threads(threads)


def test_all_families_registered():
    assert set(FAMILIES) <= set(list_model_schedules())


def test_declared_sequence_parallelism_is_what_each_recipe_takes():
    """``supports_sequence_parallel`` (what the planner searches without building) says for
    each recipe whether it takes ``sequence_parallel=True``: the declared ones schedule a tiny
    model with it (TP 2 runs are in test_tp2_matches_reference), the others refuse it."""
    declared = {f for f in FAMILIES if supports_sequence_parallel(f)}
    assert declared == {"gpt2", "gpt_neo", "llama"}
    assert not supports_sequence_parallel("auto")  # decided per model
    for family in FAMILIES:
        model = wideresnet() if family == "wideresnet" else tiny_model(family)
        if family in declared:
            apply_schedule(model, family, sequence_parallel=True)
        else:
            with pytest.raises(ConfigError, match="sequence_parallel is not supported"):
                apply_schedule(model, family, sequence_parallel=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_tp1_matches_reference(family):
    for ratio in (0.0, 1.0):
        assert check_family(family, ckpt_ratio=ratio) > 0


def test_tp1_variants():
    check_family("gpt2", fuse_bias_gelu="eager", ckpt_ratio=0.5)
    check_family("gpt_neo", fuse=False, fuse_bias_gelu="eager")
    check_family("bert", fuse=False, fuse_bias_gelu="eager")
    check_family("llama", fuse=False)
    check_family("bert", attn_kernel="eager", ckpt_ratio=0.5)
    check_family("roberta", fuse_bias_dropout_ln="eager", fuse_bias_gelu="eager", ckpt_ratio=0.5)


TP2_CASES = [(f, dict(ckpt_ratio=r)) for f in FAMILIES for r in (0.0, 1.0)] + [
    ("gpt2", dict(sequence_parallel=True, ckpt_ratio=0.5)),
    ("gpt_neo", dict(sequence_parallel=True, fuse_bias_gelu="eager")),
    ("llama", dict(sequence_parallel=True, fuse=False)),
    ("llama", dict(fuse=False)),
    ("t5", dict(fuse=False)),
    ("t5", dict(vocab_parallel_loss=False)),
    ("bert", dict(vocab_parallel_loss=False)),
    ("bert", dict(fuse_bias_gelu="eager")),
    ("bert", dict(fuse_bias_dropout_ln="eager", ckpt_ratio=0.5)),
]


def _tp2(cases):
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    done = []
    for family, knobs in cases:
        try:
            check_family(family, **knobs)
        except Exception as e:
            raise AssertionError(f"{family} {knobs}: {e}") from e
        done.append(family)
    return done


def test_tp2_matches_reference():
    results = run_distributed(_tp2, 2, TP2_CASES, timeout=400)
    assert results[0] == results[1] == [f for f, _ in TP2_CASES]


# ------------------------------------------------- TP=2 with replicated embeddings (ablation)
EMBEDDINGS = {"bert": "bert.embeddings.word_embeddings", "albert": "albert.embeddings."
              "word_embeddings", "gpt2": "transformer.wte", "opt": "model.decoder.embed_tokens",
              "llama": "model.embed_tokens", "t5": "shared"}


def _tp2_replicated_embeddings():
    """Layers sharded, word embedding and LM head whole: trains like the reference, and the
    embedding is really unsharded while a layer's MLP is sharded."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for family, path in EMBEDDINGS.items():
        ref, inputs = tiny_model(family), example_inputs(family)
        model = copy.deepcopy(ref)
        sch = apply_schedule(model, family, shard_embedding=False)
        compare_training(ref, model, inputs)
        weight = sch[path].mod.weight
        assert get_shard_spec(weight) is None, family
        assert weight.shape == ref.get_submodule(path).weight.shape, family
        assert any(get_shard_spec(p) is not None for p in model.parameters()), family
    with pytest.raises(ConfigError, match="sequence_parallel needs the vocab-parallel"):
        apply_schedule(tiny_model("gpt2"), "gpt2", sequence_parallel=True,
                       shard_embedding=False)
    return sorted(EMBEDDINGS)


def test_tp2_replicated_embeddings_match_reference():
    results = run_distributed(_tp2_replicated_embeddings, 2, timeout=400)
    assert results[0] == results[1] == sorted(EMBEDDINGS)


def test_knobs_are_listed_and_checked_without_a_model():
    from slapo.model_schedule import check_knobs, list_knobs

    assert {"shard_embedding", "fuse_bias_gelu", "ckpt_ratio"} <= set(list_knobs("bert"))
    assert "fuse_bias_gelu" not in list_knobs("llama")
    assert check_knobs("bert", shard_embedding=False).shard_embedding is False
    with pytest.raises(ConfigError, match="did you mean 'shard_embedding'"):
        check_knobs("bert", shard_embeding=False)
    with pytest.raises(ConfigError, match="shard_embedding must be True or False"):
        check_knobs("bert", shard_embedding="no")
    with pytest.raises(ConfigError, match="no model schedule named 'bart'"):
        list_knobs("bart")


# ---------------------------------------------------------------- checkpoint selection
def _checkpointed(model, paths):
    return [i for i, p in enumerate(paths) if has_forward_wrapper(model.get_submodule(p),
                                                                  "checkpoint")]


@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 1.0])
def test_ckpt_ratio_selects_exact_layers(ratio):
    expected = checkpoint_layer_ids(8, ratio)
    assert len(expected) == round(8 * ratio)
    for family, stack in (("gpt_neo", "transformer.h"), ("bert", "bert.encoder.layer"),
                          ("t5", "decoder.block")):
        layers = dict(num_layers=8) if family == "gpt_neo" else \
            dict(num_layers=8, num_decoder_layers=8) if family == "t5" else \
            dict(num_hidden_layers=8)
        if family == "gpt_neo":
            layers["attention_types"] = [[["global", "local"], 4]]
        model = tiny_model(family, **layers)
        apply_schedule(model, family, ckpt_ratio=ratio)
        assert _checkpointed(model, [f"{stack}.{i}" for i in range(8)]) == expected, family


@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_albert_checkpoints_exact_calls_of_the_shared_layer(ratio):
    ref = tiny_model("albert", num_hidden_layers=8)
    model = copy.deepcopy(ref)
    sch = apply_schedule(model, "albert", ckpt_ratio=ratio)
    group = "albert.encoder.albert_layer_groups.0"
    assert sch[group].metadata["checkpoint"] == checkpoint_layer_ids(8, ratio)
    compare_training(ref, model, example_inputs("albert"))  # twice: the count restarts
    compare_training(ref, model, example_inputs("albert"))


def test_wideresnet_checkpoint_keeps_batchnorm_statistics():
    ref = wideresnet()
    model = copy.deepcopy(ref)
    apply_schedule(model, "wideresnet", ckpt_ratio=1.0)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    ref(x).logits.sum().backward()
    model(x).logits.sum().backward()
    for (name, a), (_, b) in zip(ref.named_buffers(), model.named_buffers()):
        assert torch.equal(a, b), name


# ---------------------------------------------------------------- structure and errors
def test_attention_is_replaced_and_keeps_semantics():
    model = tiny_model("bert")
    apply_schedule(model, "bert")
    attn = model.bert.encoder.layer[0].attention.self
    assert isinstance(attn, SelfAttention) and not attn.attn_op.causal
    model = tiny_model("gpt_neo")
    apply_schedule(model, "gpt_neo")
    kinds = [blk.attn.attention.attn_op.window_size for blk in model.transformer.h]
    assert kinds == [None, 4]  # global, then local with its window
    model = tiny_model("albert")
    apply_schedule(model, "albert")
    assert not model.albert.encoder.albert_layer_groups[0].albert_layers[0].attention \
        .attn_op.causal


def test_eager_keeps_hf_attention_and_use_cache_is_off():
    model = tiny_model("gpt2")
    apply_schedule(model, "gpt2", attn_kernel="eager")
    assert type(model.transformer.h[0].attn).__name__ == "GPT2Attention"
    assert model.config.use_cache is False


def test_knob_errors():
    with pytest.raises(ConfigError, match="unknown knob"):
        apply_schedule(tiny_model("bert"), "bert", ckpt_ratoi=0.5)
    with pytest.raises(ConfigError, match="sequence_parallel is not supported"):
        apply_schedule(tiny_model("bert"), "bert", sequence_parallel=True)
    with pytest.raises(ConfigError, match="needs example_inputs"):
        apply_schedule(tiny_model("opt"), "opt", pipeline_cuts=[0])
    with pytest.raises(ConfigError, match="not layer indices"):
        apply_schedule(tiny_model("opt"), "opt", pipeline_cuts=[5],
                       example_inputs=example_inputs("opt"))
    with pytest.raises(ConfigError, match="not supported for albert"):
        apply_schedule(tiny_model("albert"), "albert", pipeline_cuts=[0])
    with pytest.raises(ConfigError, match="cannot find"):
        apply_schedule(tiny_model("bert"), "gpt2")


def test_delay_init_builds_replacements_on_meta():
    with slapo.init_empty_weights():
        model = tiny_model("gpt2")
    sch = apply_schedule(model, "gpt2", delay_init=True)
    assert model.transformer.h[0].attn.qkv_proj.weight.is_meta
    built, _ = slapo.build(sch, init_weights=True)
    assert not any(p.is_meta for p in built.parameters())
    out = built(**example_inputs("gpt2"))
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("family,stack", [("bert", "bert.encoder.layer"),
                                          ("opt", "model.decoder.layers")])
def test_pipeline_cuts_split_the_model_into_stages(family, stack):
    from slapo.pipeline.stages import CUTS_KEY, build_pipeline_stages

    sch = apply_schedule(tiny_model(family), family, pipeline_cuts=[0],
                         example_inputs=example_inputs(family))
    assert sch.metadata[CUTS_KEY] == [f"{stack}.0"]
    assert len(build_pipeline_stages(sch)) == 2
