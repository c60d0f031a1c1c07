"""``verify`` of a delayed-init (meta) model, and of one sub-module on its own inputs: correct
schedules pass, the fault-injection classes are still caught and localised (in process and on 2
gloo ranks), and a meta model stays on meta (a sub-module verified by itself materialises only
that sub-module)."""

import copy

import pytest
import torch
import transformers as tf
from torch import nn

import slapo
from slapo.op import attention_from_hf
from slapo.testing import example_inputs, run_distributed, tiny_config, tiny_model
from tests.verification.test_fault_injection import L0, _result, bert_tp, column, row

ACT1 = "bert.encoder.layer.1.intermediate.intermediate_act_fn"


def meta_bert(**overrides):
    with slapo.init_empty_weights():
        return tf.BertForMaskedLM(tiny_config("bert", **overrides))


def _on_meta(model):
    return all(p.is_meta for p in model.parameters())


def test_a_sub_module_is_verified_on_its_captured_inputs():
    sch = slapo.create_schedule(tiny_model("bert"), keep_original=True)
    sch[L0].checkpoint()
    report = slapo.verify(sch[L0], example_inputs("bert"), dtype=torch.float64)
    # the layer's 16 parameters and its input (hidden states: what it sends back)
    assert report.ok and len(report.grads) == 17 and "<input args[0]>" in report.grads
    assert all(n.startswith(L0 + ".") for n in report.grads if n != "<input args[0]>")
    sch[ACT1].replace(nn.GELU(approximate="tanh"))
    report = slapo.verify(sch["bert.encoder.layer.1"], example_inputs("bert"),
                          dtype=torch.float64, raise_on_mismatch=False)
    assert not report.ok and report.first_divergence[0] == ACT1
    assert slapo.verify(sch[L0], example_inputs("bert")).ok  # layer 0 is unaffected


def test_a_sub_module_is_verified_on_given_inputs_against_its_own_reference():
    ref = tiny_model("bert")
    sch = slapo.create_schedule(copy.deepcopy(ref))
    sch[ACT1].replace(nn.GELU(approximate="tanh"))
    hidden = torch.randn(2, 8, 32)
    layer1 = ref.get_submodule("bert.encoder.layer.1")
    for reference in (ref, layer1):  # the whole original, or the layer alone
        report = slapo.verify(sch["bert.encoder.layer.1"], inputs=(hidden,), reference=reference,
                              dtype=torch.float64, raise_on_mismatch=False)
        assert not report.ok and report.first_divergence[0] == ACT1
        assert slapo.verify(sch[L0], inputs=((hidden,), {}), reference=reference
                            if reference is ref else ref.get_submodule(L0)).ok


def test_verify_of_a_sub_module_needs_inputs():
    ref = tiny_model("bert")
    sch = slapo.create_schedule(copy.deepcopy(ref))
    with pytest.raises(slapo.VerifyError, match="no inputs.*Hint: pass example_inputs"):
        slapo.verify(sch[L0], reference=ref)
    with pytest.raises(slapo.VerifyError, match="given alone.*Hint: pass inputs="):
        slapo.verify(sch[L0], example_inputs("bert"), reference=ref.get_submodule(L0))


def test_a_meta_model_is_verified_with_deterministic_weights_and_stays_on_meta():
    model = meta_bert()
    sch = slapo.create_schedule(model, keep_original=True)
    for i in range(2):  # replacements built from meta weights: compared via provenance
        attn = sch[f"bert.encoder.layer.{i}.attention.self"]
        attn.replace(attention_from_hf(attn.mod, fused_qkv=True))
    report = slapo.verify(sch, example_inputs("bert"), dtype=torch.float64)
    assert report.ok and len(report.grads) == len(list(meta_bert().parameters()))
    assert len(report.derived) == 12 and _on_meta(model)
    sch[ACT1].replace(nn.GELU(approximate="tanh"))
    report = slapo.verify(sch, example_inputs("bert"), dtype=torch.float64,
                          raise_on_mismatch=False)
    assert not report.ok and report.first_divergence[0] == ACT1
    assert _on_meta(model)


def test_a_layer_of_a_meta_model_materialises_only_that_layer():
    model = meta_bert()
    sch = slapo.create_schedule(model, keep_original=True)
    sch[ACT1].replace(nn.GELU(approximate="tanh"))
    initialised = []

    def init(module, path):
        initialised.append(path)
        for name, p in module.named_parameters(recurse=False):
            torch.nn.init.normal_(p) if name == "weight" else torch.nn.init.zeros_(p)

    hidden = torch.randn(2, 8, 32)
    report = slapo.verify(sch["bert.encoder.layer.1"], inputs=(hidden,), init_weights=init,
                          dtype=torch.float64, raise_on_mismatch=False)
    assert not report.ok and report.first_divergence[0] == ACT1
    assert initialised and all(p.startswith("bert.encoder.layer.1") for p in initialised)
    assert _on_meta(model)
    with pytest.raises(slapo.VerifyError, match="meta device.*Hint: pass init_weights=True"):
        slapo.verify(sch[L0], inputs=(hidden,), init_weights=None)


# ------------------------------------------------------------------ 2 gloo ranks
def _meta_bert_tp(skip=(), **overrides):
    model = meta_bert(**overrides)
    sch = slapo.create_schedule(model, keep_original=True)
    bert_tp(sch, skip)
    return sch


def _both_ways(sch):
    """The whole meta model and its layer 0 by itself (inputs captured), fp64, rules off."""
    inputs = example_inputs("bert")
    whole = slapo.verify(sch, inputs, dtype=torch.float64, rules=False, raise_on_mismatch=False)
    layer = slapo.verify(sch[L0], inputs, dtype=torch.float64, rules=False,
                         raise_on_mismatch=False)
    return {"whole": _result(whole), "layer": _result(layer), "meta": _on_meta(sch.mod)}


def _fused_qkv(wrong_split_in_layer_0=True):
    """Fused q/k/v built from meta weights, column-sharded (layer 0 split as [q|k|v] blocks,
    against the op's per-head layout, if ``wrong_split_in_layer_0``)."""
    sch = slapo.create_schedule(meta_bert(), keep_original=True)
    for i in range(2):
        p = f"bert.encoder.layer.{i}"
        sch[f"{p}.attention.self"].replace(
            attention_from_hf(sch[f"{p}.attention.self"].mod, fused_qkv=True))
        wrong = i == 0 and wrong_split_in_layer_0
        column(sch[f"{p}.attention.self.qkv_proj"], fused=3 if wrong else 1)
        sch[f"{p}.attention.self"].sync("bwd_post", "all_reduce")
        row(sch[f"{p}.attention.output.dense"])
    return sch


def _run_on_ranks():
    out = {"correct": _both_ways(_meta_bert_tp()),
           "missing_row_all_reduce": _both_ways(_meta_bert_tp({(0, "attn_out_sync")})),
           "wrong_shard_axis": _both_ways(_meta_bert_tp({(0, "mlp_axis")})),
           "missing_backward_all_reduce": _both_ways(_meta_bert_tp({(0, "attn_bwd")})),
           "qkv_split_not_matching_heads": _both_ways(_fused_qkv()),
           "fused_qkv_correct": _both_ways(_fused_qkv(wrong_split_in_layer_0=False))}
    sch = _meta_bert_tp()
    out["layer_rules"] = _result(slapo.verify(sch[L0], example_inputs("bert"),
                                              raise_on_mismatch=False))
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_distributed(_run_on_ranks, 2, timeout=400)


def test_meta_tp_schedule_and_its_layer_pass_on_2_ranks(ranks):
    for r in ranks:
        assert r["correct"]["whole"]["ok"] and r["correct"]["layer"]["ok"], r["correct"]
        # sharded qkv_proj shards get the original q/k/v values through provenance
        fused = r["fused_qkv_correct"]
        assert fused["whole"]["ok"] and fused["layer"]["ok"], fused
        assert r["layer_rules"]["ok"] and all(v["meta"] for k, v in r.items() if "meta" in v)


def test_faults_are_caught_in_meta_models_and_in_their_layer_on_2_ranks(ranks):
    for r in ranks:
        for way in ("whole", "layer"):
            row_fault = r["missing_row_all_reduce"][way]
            assert row_fault["first"] == f"{L0}.attention.output.dense", row_fault["text"]
            assert r["wrong_shard_axis"][way]["error"] == f"{L0}.intermediate.dense"
            bwd = r["missing_backward_all_reduce"][way]
            assert not bwd["ok"] and bwd["first"] is None  # the forward is right
            assert r["qkv_split_not_matching_heads"][way]["first"] == f"{L0}.attention.self"
        # by itself, the layer shows the fault in the gradient it sends back to its input
        assert "<input args[0]>" in r["missing_backward_all_reduce"]["layer"]["text"]
