"""Fault injection: wrong tensor-parallel schedules must be caught by ``slapo.verify`` (rules and
numerics), and the report must name the module where the mistake is. Correct schedules of BERT,
GPT-2 and LLaMA must pass at TP=2 in fp32 and fp64. One 2-rank spawn runs everything."""

import copy

import torch
import torch.distributed as dist
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

import slapo
from slapo.runtime.forward_wrap import forward_wrappers
from slapo.testing import MLP, example_inputs, tiny_model
from tests.sharding.test_tp_models import SCHEDULES, column, row

L0 = "bert.encoder.layer.0"


def bert_tp(sch, skip=()):
    """The correct Megatron schedule of tiny BERT, minus the steps named in ``skip``."""
    for i in range(2):
        p = f"bert.encoder.layer.{i}"
        for n in ("query", "key", "value"):
            column(sch[f"{p}.attention.self.{n}"])
        if (i, "attn_bwd") not in skip:
            sch[f"{p}.attention.self"].sync("bwd_post", "all_reduce")
        if (i, "attn_out_sync") in skip:
            sch[f"{p}.attention.output.dense"].shard("weight", axis=1)
        else:
            row(sch[f"{p}.attention.output.dense"])
        if (i, "mlp_axis") in skip:
            sch[f"{p}.intermediate.dense"].shard("weight", axis=1)  # wrong axis
        else:
            column(sch[f"{p}.intermediate.dense"])
            sch[f"{p}.intermediate.dense"].sync("bwd_post", "all_reduce")
        row(sch[f"{p}.output.dense"])


def _result(report):
    return {
        "ok": report.ok,
        "rules": [p.path for p in report.problems],
        "first": report.first_divergence[0] if report.first_divergence else None,
        "grad_first": (report.first_grad_divergence[0] if report.first_grad_divergence
                       else None),
        "error": report.error[0] if report.error else None,
        "text": str(report),
    }


def _check(sch, ref, inputs, **kw):
    """Rule check, then the numerical check with rules off (both must find the fault)."""
    rules = slapo.verify(sch, inputs, reference=ref, raise_on_mismatch=False, **kw)
    numeric = slapo.verify(sch, inputs, reference=ref, raise_on_mismatch=False, rules=False,
                           dtype=torch.float64, **kw)
    return {"rules": _result(rules), "numeric": _result(numeric)}


def _bert(skip=(), **overrides):
    ref = tiny_model("bert", **overrides)
    sch = slapo.create_schedule(copy.deepcopy(ref))
    bert_tp(sch, skip)
    return sch, ref


def fault_missing_row_all_reduce():
    sch, ref = _bert(skip={(0, "attn_out_sync")})
    return _check(sch, ref, example_inputs("bert"))


def fault_wrong_shard_axis():
    sch, ref = _bert(skip={(0, "mlp_axis")})
    return _check(sch, ref, example_inputs("bert"))


def fault_bias_added_on_every_rank():
    ref = MLP()
    sch = slapo.create_schedule(copy.deepcopy(ref))
    column(sch["fc1"])
    sch["fc1"].sync("bwd_post", "all_reduce")
    sch["fc2"].shard("weight", axis=1)
    sch.sync("fwd_post", "all_reduce")  # reduces after fc2's bias: bias counted twice
    return _check(sch, ref, (torch.randn(4, 16),))


def fault_missing_backward_all_reduce():
    sch, ref = _bert(skip={(0, "attn_bwd")})
    return _check(sch, ref, example_inputs("bert"))


def fault_qkv_split_not_matching_heads():
    from slapo.op import attention_from_hf

    ref = tiny_model("bert")
    model = copy.deepcopy(ref)
    sch = slapo.create_schedule(model)
    for i in range(2):
        p = f"bert.encoder.layer.{i}"
        sch[f"{p}.attention.self"].replace(
            attention_from_hf(sch[f"{p}.attention.self"].mod, fused_qkv=True))
        # The op's fused layout groups rows per head; fused=3 treats it as [q | k | v] blocks.
        column(sch[f"{p}.attention.self.qkv_proj"], fused=3 if i == 0 else 1)
        sch[f"{p}.attention.self"].sync("bwd_post", "all_reduce")
        row(sch[f"{p}.attention.output.dense"])
    return _check(sch, ref, example_inputs("bert"))


def fault_missing_fork_rng():
    sch, ref = _bert(attention_probs_dropout_prob=0.1)
    return _check(sch, ref, example_inputs("bert"))


def fault_wrong_vocab_offset():
    ref = tiny_model("bert", tie_word_embeddings=False)
    sch = slapo.create_schedule(copy.deepcopy(ref))
    emb = sch["bert.embeddings.word_embeddings"]
    emb.shard("weight", axis=0)
    emb.sync("fwd_post", "all_reduce")
    # The lookup subtracts the wrong offset (off by one row, like the original Slapo's bug).
    forward_wrappers(emb.mod)["vocab_parallel"].start += 1
    return _check(sch, ref, example_inputs("bert"))


class CheckpointWithoutRNG(nn.Module):
    """A hand-written checkpoint wrapper that forgets to restore the RNG state."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, hidden_states, *args, **kwargs):
        return torch_checkpoint.checkpoint(self.inner, hidden_states, *args, use_reentrant=False,
                                           preserve_rng_state=False, **kwargs)


def fault_checkpoint_without_rng_restore():
    ref = tiny_model("bert", hidden_dropout_prob=0.2)
    sch = slapo.create_schedule(copy.deepcopy(ref))
    sch[f"{L0}.intermediate"].replace(CheckpointWithoutRNG(sch[f"{L0}.intermediate"].mod),
                                      check_signature=False)
    sch[f"{L0}.output.dropout"].replace(nn.Dropout(0.2))
    sch[f"{L0}.output"].replace(CheckpointWithoutRNG(sch[f"{L0}.output"].mod),
                                check_signature=False)
    return _check(sch, ref, example_inputs("bert"), eval_mode=False)


def correct_schedules():
    out = {}
    for family, schedule in SCHEDULES.items():
        ref = tiny_model(family) if family == "bert" else tiny_model(family, use_cache=False)
        sch = slapo.create_schedule(copy.deepcopy(ref))
        schedule(sch)
        inputs = example_inputs(family)
        out[family] = [slapo.verify(sch, inputs, reference=ref).ok,
                       slapo.verify(sch, inputs, reference=ref, dtype=torch.float64,
                                    steps=2).ok]
    return out


FAULTS = [fault_missing_row_all_reduce, fault_wrong_shard_axis, fault_bias_added_on_every_rank,
          fault_missing_backward_all_reduce, fault_qkv_split_not_matching_heads,
          fault_missing_fork_rng, fault_wrong_vocab_offset, fault_checkpoint_without_rng_restore]


def ranks_initialised_differently():
    """Each rank builds its model with another seed: verify loads the original's weights
    (broadcast from rank 0) into every rank's shards, unless told not to."""
    ref = tiny_model("bert", seed=dist.get_rank())
    sch = slapo.create_schedule(copy.deepcopy(ref))
    SCHEDULES["bert"](sch)
    inputs = example_inputs("bert")
    loaded = slapo.verify(sch, inputs, reference=ref, raise_on_mismatch=False).ok
    own = slapo.verify(sch, inputs, reference=ref, raise_on_mismatch=False,
                       load_weights=False).ok
    return loaded, own


def explain_sharded_bert_layer():
    sch = slapo.create_schedule(tiny_model("bert"))
    SCHEDULES["bert"](sch)
    return str(sch[L0])


def run_all():
    results = {f.__name__: f() for f in FAULTS}
    results["correct"] = correct_schedules()
    results["explain"] = explain_sharded_bert_layer()
    results["different_init"] = ranks_initialised_differently()
    return results


def _both(results, name):
    return [r[name] for r in results]


def test_correct_schedules_pass_fp32_and_fp64(results):
    for r in results:
        assert r["correct"] == {"bert": [True, True], "gpt2": [True, True],
                                "llama": [True, True]}


def test_missing_row_all_reduce(results):
    for r in _both(results, "fault_missing_row_all_reduce"):
        assert r["rules"]["rules"] == [f"{L0}.attention.output.dense"]
        assert r["numeric"]["first"] == f"{L0}.attention.output.dense"


def test_wrong_shard_axis(results):
    for r in _both(results, "fault_wrong_shard_axis"):
        assert f"{L0}.intermediate.dense" in r["rules"]["rules"]
        assert r["numeric"]["error"] == f"{L0}.intermediate.dense"
        assert "raised in" in r["numeric"]["text"]


def test_bias_added_on_every_rank(results):
    for r in _both(results, "fault_bias_added_on_every_rank"):
        assert r["rules"]["rules"] == ["fc2"]
        assert r["numeric"]["first"] == "fc2" and not r["numeric"]["ok"]


def test_missing_backward_all_reduce(results):
    for r in _both(results, "fault_missing_backward_all_reduce"):
        assert all(p.startswith(f"{L0}.attention.self.") for p in r["rules"]["rules"])
        assert r["rules"]["rules"]
        num = r["numeric"]
        assert not num["ok"] and num["first"] is None  # the forward is right
        assert num["grad_first"].startswith("bert.embeddings")  # the region's input gradient


def test_qkv_split_not_matching_heads(results):
    for r in _both(results, "fault_qkv_split_not_matching_heads"):
        # qkv_proj has no counterpart in the original (it fuses query/key/value): the first
        # comparable module is the attention that owns it
        assert r["numeric"]["first"] == f"{L0}.attention.self"
        assert not r["rules"]["ok"]


def test_missing_fork_rng(results):
    for r in _both(results, "fault_missing_fork_rng"):
        assert r["rules"]["rules"] == [f"{L0}.attention.self",
                                       "bert.encoder.layer.1.attention.self"]
        assert "fork_rng" in r["rules"]["text"]


def test_wrong_vocab_offset(results):
    for r in _both(results, "fault_wrong_vocab_offset"):
        assert r["numeric"]["first"] == "bert.embeddings.word_embeddings"
        assert not r["rules"]["ok"]


def test_checkpoint_without_rng_restore(results):
    for r in _both(results, "fault_checkpoint_without_rng_restore"):
        num = r["numeric"]
        assert not num["ok"] and num["first"] is None
        assert num["grad_first"] is not None and num["grad_first"].startswith(L0)


def test_verify_loads_the_original_weights_into_each_shard(results):
    # without loading, rank 1's shards come from another model, so the TP sums are wrong on
    # every rank
    assert [r["different_init"] for r in results] == [(True, False), (True, False)]
