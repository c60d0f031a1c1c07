"""Tensor parallelism on tiny HF models (2 gloo ranks): sharded BERT, GPT-2 and LLaMA layers
train exactly like the unsharded reference (outputs, gradients, parameters after SGD steps)."""

import copy


import slapo
from slapo.sharding import check_layouts
from slapo.testing import example_inputs, tiny_model
from tests.sharding.helpers import train_and_compare


def column(sch, names=("weight", "bias"), axis=0, **kw):
    sch.shard(list(names), axis=axis, **kw)


def row(sch, axis=1):
    sch.shard("weight", axis=axis)
    sch.sync("fwd_post", "all_reduce")


def schedule_bert(sch):
    for i in range(2):
        p = f"bert.encoder.layer.{i}"
        for n in ("query", "key", "value"):
            column(sch[f"{p}.attention.self.{n}"])
        sch[f"{p}.attention.self"].sync("bwd_post", "all_reduce")
        row(sch[f"{p}.attention.output.dense"])
        column(sch[f"{p}.intermediate.dense"])
        sch[f"{p}.intermediate.dense"].sync("bwd_post", "all_reduce")
        row(sch[f"{p}.output.dense"])
    attn = sch["bert.encoder.layer.0.attention.self"].mod
    assert (attn.num_attention_heads, attn.all_head_size) == (2, 16)


def schedule_gpt2(sch):
    for i in range(2):
        h = f"transformer.h.{i}"
        column(sch[f"{h}.attn.c_attn"], axis=1, fused=3)
        sch[f"{h}.attn.c_attn"].sync("bwd_post", "all_reduce")
        row(sch[f"{h}.attn.c_proj"], axis=0)
        column(sch[f"{h}.mlp.c_fc"], axis=1)
        sch[f"{h}.mlp.c_fc"].sync("bwd_post", "all_reduce")
        row(sch[f"{h}.mlp.c_proj"], axis=0)
    attn = sch["transformer.h.0.attn"].mod
    assert (attn.num_heads, attn.embed_dim, attn.split_size) == (2, 16, 16)
    assert sch["transformer.h.0.attn.c_attn"].mod.weight.shape[1] == 48  # Conv1D: [in, out]


def schedule_llama(sch):
    for i in range(2):
        p = f"model.layers.{i}"
        for n in ("q_proj", "k_proj", "v_proj"):  # GQA: 4 query heads, 2 key/value heads
            column(sch[f"{p}.self_attn.{n}"], names=("weight",))
        sch[f"{p}.self_attn"].sync("bwd_post", "all_reduce")
        row(sch[f"{p}.self_attn.o_proj"])
        for n in ("gate_proj", "up_proj"):
            column(sch[f"{p}.mlp.{n}"], names=("weight",))
        sch[f"{p}.mlp"].sync("bwd_post", "all_reduce")
        row(sch[f"{p}.mlp.down_proj"])
    assert sch["model.layers.0.self_attn.k_proj"].mod.out_features == 8  # one kv head per rank


SCHEDULES = {"bert": schedule_bert, "gpt2": schedule_gpt2, "llama": schedule_llama}


def _tp_families(families):
    done = []
    for family in families:
        ref = tiny_model(family, use_cache=False) if family != "bert" else tiny_model(family)
        model = copy.deepcopy(ref)
        sch = slapo.create_schedule(model)
        SCHEDULES[family](sch)
        problems = check_layouts(sch)
        assert problems == [], [str(p) for p in problems]
        train_and_compare(ref, model, example_inputs(family), steps=3, rtol=1e-4, atol=1e-5)
        done.append(family)
    return done


def tp_bert_gpt2_llama():
    return _tp_families(["bert", "gpt2", "llama"])


def test_tp_bert_gpt2_llama_match_reference(hf_two_ranks):
    assert hf_two_ranks["tp_bert_gpt2_llama"] == [["bert", "gpt2", "llama"]] * 2
