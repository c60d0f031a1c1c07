import pytest
import torch
from torch import nn

import slapo
from slapo.testing import MLP, example_inputs, tiny_model

ACT = "bert.encoder.layer.0.intermediate.intermediate_act_fn"


def test_correct_schedule_passes_fp32_and_fp64():
    sch = slapo.create_schedule(tiny_model("bert"), keep_original=True)
    sch[ACT].replace(nn.GELU())
    sch["bert.encoder.layer.1"].checkpoint()
    report = slapo.verify(sch, example_inputs("bert"))
    assert report.ok and "loss" in report.outputs and "logits" in report.outputs
    assert set(report.grads) == {n for n, _ in sch.original.named_parameters()}
    assert all(d.ok for d in report.grads.values())
    assert slapo.verify(sch, example_inputs("bert"), dtype=torch.float64, steps=2).ok


def test_wrong_replacement_is_localised():
    sch = slapo.create_schedule(tiny_model("bert"), keep_original=True)
    sch[ACT].replace(nn.GELU(approximate="tanh"))  # close, but not the same function
    with pytest.raises(slapo.VerifyError) as info:
        slapo.verify(sch, example_inputs("bert"), dtype=torch.float64)
    msg = str(info.value)
    assert f"first divergence at '{ACT}'" in msg
    assert "output 'logits' differs" in msg and "gradients of" in msg


def test_verify_restores_the_model():
    model = MLP()
    sch = slapo.create_schedule(model, keep_original=True)
    sch["act"].replace(nn.ReLU())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    report = slapo.verify(sch, (torch.randn(4, 16),), steps=3, dtype=torch.float64,
                          raise_on_mismatch=False)
    assert not report.ok and report.first_divergence[0] == "act"
    assert report.params_after_step  # steps > 1 compares parameters
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) and after[k].dtype == before[k].dtype
               for k in before)
    assert model.training and model.fc1.weight.grad is None


def test_verify_context_manager():
    sch = slapo.create_schedule(tiny_model("gpt2"))
    inputs = example_inputs("gpt2")
    with slapo.Verify(sch, inputs) as v:
        sch["transformer.h.0.mlp.act"].replace(nn.GELU(approximate="tanh"))
    assert v.report.ok
    with pytest.raises(slapo.VerifyError, match="first divergence at 'transformer.h.1.mlp.act'"):
        with slapo.Verify(sch, inputs):
            sch["transformer.h.1.mlp.act"].replace(nn.ReLU())
    with slapo.Verify(sch, inputs, enable=False):
        sch["transformer.h.1.mlp.act"].replace(nn.SiLU())  # not verified


def test_verify_needs_a_reference_and_real_weights():
    sch = slapo.create_schedule(MLP())
    with pytest.raises(slapo.VerifyError, match="no original model.*keep_original=True"):
        slapo.verify(sch, (torch.randn(2, 16),))
    with slapo.init_empty_weights():
        meta = MLP()
    with pytest.raises(slapo.VerifyError, match="meta device.*Hint: pass init_weights=True"):
        slapo.verify(slapo.create_schedule(meta), (torch.randn(2, 16),), reference=meta,
                     init_weights=None)


def test_explain_lists_changes():
    sch = slapo.create_schedule(tiny_model("bert"))
    assert "nothing scheduled" in slapo.explain(sch)
    sch[ACT].replace(nn.GELU())
    sch["bert.encoder.layer.1"].checkpoint()
    sch["bert.encoder.layer.0.output.LayerNorm"].annotate("weight", "replicated_param", True)
    text = str(sch)
    assert text.splitlines()[0].startswith("BertForMaskedLM: 3 of ")
    assert f"  {ACT} (GELU): replaced GELUActivation -> GELU" in text
    assert "  bert.encoder.layer.1 (BertLayer): checkpointed" in text
    assert "annotate weight.replicated_param=True" in text


def test_in_place_activations_and_backward_localisation():
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(inplace=True),
                             nn.Linear(8, 4))

    sch = slapo.create_schedule(make(), keep_original=True)
    assert slapo.verify(sch, (torch.randn(6, 8),), eval_mode=False).ok
    # a wrong backward only: the forward matches, the gradient reaching '0' does not
    sch["1"].replace(GradScaled(sch["1"].mod))
    report = slapo.verify(sch, (torch.randn(6, 8),), eval_mode=False, raise_on_mismatch=False)
    assert not report.ok and report.first_divergence is None
    assert report.first_grad_divergence[0] == "0"


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return 2 * g


class GradScaled(nn.Module):
    """Same forward as ``inner``; doubles the gradient flowing back into it."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(_ScaleGrad.apply(x))


def test_original_verify_arguments_fail_at_the_call():
    """The original's Verify(sch, inputs, device="cuda", eval_mode, enable) moved the model and
    the inputs to ``device``; verify moves nothing, so another device is an error before the
    block runs; positional and misspelt arguments too (not a TypeError after the block)."""
    sch = slapo.create_schedule(MLP(), keep_original=True)
    inputs = (torch.randn(2, 16),)
    for device in ("cuda", "cuda:1", "meta"):
        with pytest.raises(slapo.VerifyError, match=rf"device='{device}', but the scheduled "
                           rf"module's weights are on 'cpu'.*Hint: .*model.to\('{device}'\)"):
            slapo.Verify(sch, inputs, device=device)
        with pytest.raises(slapo.VerifyError, match="moved both to device"):
            slapo.verify(sch, inputs, device=device)
    with slapo.init_empty_weights():
        meta = MLP()
    with pytest.raises(slapo.VerifyError, match=r"the inputs are on 'cpu'.*Hint: move both"):
        slapo.verify(slapo.create_schedule(meta), inputs, reference=meta, device="meta")
    with slapo.Verify(sch, inputs, device="cpu", eval_mode=True) as v:  # where it runs: fine
        sch["act"].replace(nn.GELU())
    assert v.report.ok and slapo.verify(sch, inputs, device=torch.device("cpu")).ok
    with pytest.raises(slapo.VerifyError, match=r"positionally.*Hint: pass them by keyword"):
        slapo.Verify(sch, inputs, "cuda", True, True)
    with pytest.raises(slapo.VerifyError, match=r"unknown argument\(s\) devcie.*device=\?"):
        slapo.Verify(sch, inputs, devcie="cpu")
    with pytest.raises(slapo.VerifyError, match=r"reference.*slapo.verify\(sch, example_inputs"):
        slapo.Verify(sch, inputs, reference=MLP())
    with slapo.Verify(sch, inputs, device="cuda", enable=False):  # disabled: nothing checked
        pass


def test_float32_rounding_in_a_float64_verify_says_so():
    """HF's GPT-Neo computes attention in float32 whatever the dtype; the op library's attention
    does not: a float64 verify sees differences at float32 level, and the hint says why."""
    from slapo.op.hf_attention import attention_from_hf

    model = tiny_model("gpt_neo")
    sch = slapo.create_schedule(model, keep_original=True)
    attn = sch["transformer.h.0.attn.attention"]
    attn.replace(attention_from_hf(attn.mod))
    inputs = example_inputs("gpt_neo")
    with pytest.raises(slapo.VerifyError, match=r"float32 rounding level \(max rel "
                                                r".*GPT-Neo attention.*verify in float32"):
        slapo.verify(sch, inputs, dtype=torch.float64)
    assert slapo.verify(sch, inputs).ok  # float32: equal within its tolerance
