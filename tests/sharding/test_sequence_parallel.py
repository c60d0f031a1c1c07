"""Sequence parallelism (with tensor parallelism) on tiny GPT-2 and LLaMA, 2 gloo ranks: the
scheduled models train exactly like the references once replicated gradients are summed."""

import copy

import torch.distributed as dist

import slapo
from slapo.op.cross_entropy import VocabParallelCausalLMLoss
from slapo.sharding import (
    check_layouts,
    gather_sequence,
    mark_replicated,
    reduce_scatter_sequence,
    scatter_sequence,
)
from slapo.testing import example_inputs, tiny_model
from tests.sharding.helpers import train_and_compare


def _gpt2(sch):
    # vocab-parallel embedding and LM head (tied), sequence-parallel blocks
    sch["lm_head"].shard("weight", axis=0)
    sch["transformer.wte"].sync("fwd_post", "all_reduce")
    scatter_sequence(sch["transformer.drop"])
    for i in range(2):
        h = f"transformer.h.{i}"
        for norm, col, row in (("ln_1", "attn.c_attn", "attn.c_proj"),
                               ("ln_2", "mlp.c_fc", "mlp.c_proj")):
            mark_replicated(sch[f"{h}.{norm}"])
            gather_sequence(sch[f"{h}.{norm}"])
            sch[f"{h}.{col}"].shard(["weight", "bias"], axis=1,
                                    fused=3 if col == "attn.c_attn" else 1)
            sch[f"{h}.{row}"].shard("weight", axis=0)
            reduce_scatter_sequence(sch[f"{h}.{row}"])
    mark_replicated(sch["transformer.ln_f"])
    gather_sequence(sch["transformer.ln_f"])  # feeds the vocab-parallel head
    sch.mod.loss_function = VocabParallelCausalLMLoss()


def _llama(sch):
    sch["model.layers.0"].sync("fwd_pre", "scatter", axis=1)  # masks/rotary see the full sequence
    for i in range(2):
        p = f"model.layers.{i}"
        for norm, cols, row in (("input_layernorm", ("q_proj", "k_proj", "v_proj"), "o_proj"),
                                ("post_attention_layernorm", ("gate_proj", "up_proj"),
                                 "down_proj")):
            mark_replicated(sch[f"{p}.{norm}"])
            gather_sequence(sch[f"{p}.{norm}"])
            sub = "self_attn" if row == "o_proj" else "mlp"
            for c in cols:
                sch[f"{p}.{sub}.{c}"].shard("weight", axis=0)
            sch[f"{p}.{sub}.{row}"].shard("weight", axis=1)
            reduce_scatter_sequence(sch[f"{p}.{sub}.{row}"])
    mark_replicated(sch["model.norm"])
    gather_sequence(sch["model.norm"], tensor_parallel_output_grad=False)  # replicated head


def _sequence_parallel(families):
    rank = dist.get_rank()
    for family in families:
        ref = tiny_model(family, use_cache=False)
        model = copy.deepcopy(ref)
        sch = slapo.create_schedule(model)
        (_gpt2 if family == "gpt2" else _llama)(sch)
        problems = check_layouts(sch)
        assert problems == [], [str(p) for p in problems]
        assert "replicated_param" in sch.param_tags

        def out_fn(out, family=family):
            logits = out.logits
            if family == "gpt2" and logits.shape[-1] == 128:
                logits = logits[..., rank * 64:(rank + 1) * 64]
            return {"loss": out.loss, "logits": logits}

        train_and_compare(ref, model, example_inputs(family), steps=3, out_fn=out_fn,
                          sequence_parallel=True, rtol=1e-4, atol=1e-5)
    return families


def sp_gpt2_llama():
    return _sequence_parallel(["gpt2", "llama"])


def test_sequence_parallel_gpt2_llama_match_reference(hf_two_ranks):
    assert hf_two_ranks["sp_gpt2_llama"] == [["gpt2", "llama"]] * 2
