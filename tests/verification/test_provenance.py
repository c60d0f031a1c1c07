"""``slapo.verify`` compares parameters a schedule renamed or re-laid (fused ``qkv_proj``, GPT-2's
Conv1D ``c_attn``, the op MLP's ``fc_in``/``fc_out`` ...) through the provenance records of the
replacement modules (:mod:`slapo.provenance`), at TP=1 and TP=2 (one 2-rank spawn); a fault in a
fused gradient or value is caught and named by its original parameter."""

import copy
import warnings

import pytest
import torch
from torch import nn

import slapo
from slapo.errors import PrimitiveError
from slapo.model_schedule import apply_schedule
from slapo.op import attention_from_hf
from slapo.provenance import derived_parameters, provenance_of, record_provenance, transposed
from slapo.testing import MLP, example_inputs, run_distributed, tiny_model

L0 = "bert.encoder.layer.0.attention.self"
HF_FAMILIES = ("bert", "roberta", "albert", "gpt2", "gpt_neo", "opt", "t5", "llama")
F64 = dict(dtype=torch.float64)


def _schedule(family, group=None, **knobs):
    ref = tiny_model(family)
    sch = apply_schedule(copy.deepcopy(ref), family, group=group, **knobs)
    return sch, ref


def _verify(sch, ref, family, fp32=False, **kw):
    # HF's GPT-Neo attention computes in float32 even in a float64 model: fp32 tolerances
    dtype = torch.float32 if fp32 or family == "gpt_neo" else torch.float64
    return slapo.verify(sch, example_inputs(family), reference=ref, raise_on_mismatch=False,
                        dtype=dtype, **kw)


def _fused_bert(group=None):
    """Tiny BERT with the op attention (fused q/k/v) on both layers, TP over ``group``."""
    return _schedule("bert", group=group)


def _inject_key_head0_grad(sch, layer=0):
    """Scale the gradient rows of key head 0 in the fused qkv_proj of ``layer`` (grouped
    layout, one q head per kv head: rows [D, 2D) of this rank's shard; on rank 0 of a TP group
    that is global key head 0)."""
    attn = sch[f"bert.encoder.layer.{layer}.attention.self"].mod
    d = attn.head_dim
    scale = torch.ones(attn.qkv_proj.weight.shape[0], 1, dtype=torch.float64)
    scale[d:2 * d] = 1.5
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if rank == 0:
        attn.qkv_proj.weight.register_hook(lambda g: g * scale.to(g.dtype))


def _summary(report):
    return {"ok": report.ok, "unmatched": list(report.unmatched), "derived": dict(report.derived),
            "bad_grads": sorted(k for k, d in report.grads.items() if not d.ok),
            "bad_values": sorted(k for k, d in report.derived_values.items() if not d.ok),
            "grads": sorted(report.grads), "text": str(report)}


# ------------------------------------------------------------------------------ TP = 1


def test_fused_qkv_is_compared_not_unmatched():
    sch, ref = _fused_bert()
    report = _verify(sch, ref, "bert", steps=2)
    assert report.ok, str(report)
    assert report.unmatched == []
    assert report.derived[f"{L0}.query.weight"] == f"'{L0}.qkv_proj.weight'"
    for p in ("query", "key", "value"):
        for t in ("weight", "bias"):
            name = f"{L0}.{p}.{t}"
            assert report.grads[name].ok and report.derived_values[name].ok
            assert report.params_after_step[name].ok
    assert set(report.grads) == {n for n, _ in ref.named_parameters()}
    assert "compared through their provenance records" in str(report)


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_every_recipe_leaves_nothing_unmatched(family):
    warnings.filterwarnings("ignore", message=".*backward hooks.*")
    knobs = dict(fuse_bias_gelu="eager") if family in ("gpt2", "gpt_neo") else {}
    sch, ref = _schedule(family, **knobs)
    report = _verify(sch, ref, family)
    assert report.ok, str(report)
    assert report.unmatched == [] and report.derived
    assert set(report.grads) >= {n for n, p in ref.named_parameters()} - set(report.unmatched) \
        - {n for n, _ in ref.named_parameters() if n.endswith("relative_attention_bias.weight")}


def test_gpt2_conv1d_mappings():
    for knobs in (dict(fuse_bias_gelu="eager"), dict(fuse=False)):
        sch, ref = _schedule("gpt2", **knobs)
        report = _verify(sch, ref, "gpt2")
        assert report.ok and report.unmatched == [], str(report)
        held = report.derived["transformer.h.0.attn.c_attn.weight"]
        if knobs.get("fuse") is False:  # q/k/v Linears concatenated and transposed back
            assert held.count("_proj.weight") == 3
        else:
            assert held == "'transformer.h.0.attn.qkv_proj.weight'"
            assert report.derived["transformer.h.0.mlp.c_fc.weight"] == \
                "'transformer.h.0.mlp.fc_in.weight'"


def test_fault_in_fused_qkv_gradient_is_named():
    sch, ref = _fused_bert()
    _inject_key_head0_grad(sch)
    r = _summary(_verify(sch, ref, "bert"))
    assert not r["ok"]
    assert r["bad_grads"] == [f"{L0}.key.weight"]
    assert f"'{L0}.key.weight' (held as '{L0}.qkv_proj.weight')" in r["text"]


def test_fault_in_fused_qkv_value_is_named():
    sch, ref = _fused_bert()
    qkv = sch[f"{L0}.qkv_proj"].mod
    d = sch[L0].mod.head_dim
    with torch.no_grad():
        qkv.weight[2 * d:3 * d] += 0.1  # value head 0
    r = _summary(_verify(sch, ref, "bert"))
    assert not r["ok"] and r["bad_values"] == [f"{L0}.value.weight"]
    assert "values of 1 renamed parameter(s) differ" in r["text"]


def test_verify_block_with_replacement_inside():
    sch = slapo.create_schedule(tiny_model("bert"))
    with slapo.Verify(sch, example_inputs("bert"), **F64) as v:
        sch[L0].replace(attention_from_hf(sch[L0].mod, fused_qkv=True))
    assert v.report.ok and v.report.unmatched == [] and f"{L0}.key.bias" in v.report.derived


class TransposedLinear(nn.Module):
    """A user-written replacement storing the weight ``[in, out]`` under another name."""

    def __init__(self, lin: nn.Linear):
        super().__init__()
        self.w_t = nn.Parameter(lin.weight.detach().t().clone())
        self.shift = nn.Parameter(lin.bias.detach().clone())

    def forward(self, x):
        return x @ self.w_t + self.shift


def test_user_replacement_records_provenance():
    ref = MLP()
    x = (torch.randn(4, 16),)
    sch = slapo.create_schedule(copy.deepcopy(ref))
    sch["fc1"].replace(TransposedLinear(sch["fc1"].mod))
    report = slapo.verify(sch, x, reference=ref, **F64)
    assert sorted(report.unmatched) == ["fc1.bias", "fc1.weight"]  # no record: not compared

    sch = slapo.create_schedule(copy.deepcopy(ref))
    new = TransposedLinear(sch["fc1"].mod)
    record_provenance(new, "weight", "w_t", transposed)
    record_provenance(new, "bias", "shift")
    assert set(provenance_of(copy.deepcopy(new))) == {"weight", "bias"}  # survives copies
    sch["fc1"].replace(new)
    assert set(derived_parameters(sch.mod)) == {"fc1.weight", "fc1.bias"}
    report = slapo.verify(sch, x, reference=ref, steps=2, **F64)
    assert report.unmatched == [] and report.grads["fc1.weight"].ok
    assert report.params_after_step["fc1.weight"].ok

    new.w_t.register_hook(lambda g: g * 2)  # a wrong gradient, caught by its original name
    report = slapo.verify(sch, x, reference=ref, raise_on_mismatch=False, **F64)
    assert [k for k, d in report.grads.items() if not d.ok] == ["fc1.weight"]


def test_record_provenance_checks_names():
    new = TransposedLinear(nn.Linear(2, 3))
    with pytest.raises(PrimitiveError, match=r"'wt' is not a parameter.*Hint: parameters: "
                                             r"shift, w_t"):
        record_provenance(new, "weight", "wt")


# ------------------------------------------------------------------------------ TP = 2


def _tp2():
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    out = {}
    for family in ("bert", "gpt2", "llama"):
        knobs = dict(fuse_bias_gelu="eager") if family == "gpt2" else {}
        sch, ref = _schedule(family, **knobs)
        # causal LMs at TP: the vocab-parallel loss computes in float32 (slapo.op.cross_entropy)
        out[family] = _summary(_verify(sch, ref, family, fp32=family != "bert", steps=2))
    sch, ref = _fused_bert()
    _inject_key_head0_grad(sch)
    out["fault"] = _summary(_verify(sch, ref, "bert"))
    return out


def test_tp2_fused_parameters_compared_and_fault_named():
    results = run_distributed(_tp2, 2, timeout=300)
    for r in results:
        for family in ("bert", "gpt2", "llama"):
            assert r[family]["ok"], r[family]["text"]
            assert r[family]["unmatched"] == [] and r[family]["derived"]
        fault = r["fault"]
        assert not fault["ok"] and fault["bad_grads"] == [f"{L0}.key.weight"]
        assert f"'{L0}.key.weight' (held as '{L0}.qkv_proj.weight')" in fault["text"]
