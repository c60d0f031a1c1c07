"""The ``hf-tp`` baseline (end2end/driver/baselines/hf_tp.py): transformers' own tensor
parallelism from each model's plan, on 2 gloo ranks, trains every family that declares a plan
exactly as one process does (losses over three SGD steps, and the first step's gradients, each
rank's DTensor gradient gathered whole), with fewer parameters per rank than the whole model;
Gemma 3's tied LM head included; a family without a plan is refused with the reason."""

import pytest
import torch

from end2end.models import build_model, count_parameters, get_model_spec, make_inputs
from slapo.errors import ConfigError
from slapo.testing import run_distributed

MODELS = ("tiny/qwen3", "tiny/mistral", "tiny/gemma3", "tiny/phi3", "tiny/mixtral",
          "tiny/qwen3-moe", "tiny/llama")
STEPS = 3
TOL = dict(rtol=1e-5, atol=1e-6)


def _whole(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _train(model, name):
    """Losses of STEPS SGD steps (a different batch each) and the first step's gradients."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, grads = [], None
    for step in range(STEPS):
        batch = make_inputs(get_model_spec(name), 2, 16,
                            generator=torch.Generator().manual_seed(step))
        opt.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        if grads is None:
            grads = {n: _whole(p.grad).clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(_whole(loss.detach()).item())
    return losses, grads


def _sharded_runs():
    from end2end.driver.baselines.hf_tp import apply_hf_tensor_parallel

    out = {}
    for name in MODELS:
        model = apply_hf_tensor_parallel(build_model(name, seed=0), 2)
        local = sum((p.to_local() if hasattr(p, "to_local") else p).numel()
                    for p in model.parameters())
        out[name] = (*_train(model, name), local)
    return out


def test_hf_tp_matches_one_process_on_two_ranks():
    results = run_distributed(_sharded_runs, 2, timeout=400)
    for name in MODELS:
        reference = build_model(name, seed=0)
        whole = count_parameters(reference)
        ref_losses, ref_grads = _train(reference, name)
        for rank in results:
            losses, grads, local = rank[name]
            torch.testing.assert_close(losses, ref_losses, **TOL, msg=name)
            assert grads.keys() == ref_grads.keys(), name
            for param, g in grads.items():
                torch.testing.assert_close(g, ref_grads[param], **TOL,
                                           msg=lambda m, p=param, n=name: f"{n} {p}: {m}")
            assert local < 0.9 * whole, (name, local, whole)


@pytest.mark.parametrize("name", ["tiny/bert", "tiny/gpt2", "tiny/t5"])
def test_a_model_without_a_plan_is_refused_with_the_reason(name):
    from end2end.driver.baselines.hf_tp import hf_tp_plan

    with pytest.raises(ConfigError, match="declares a tensor-parallel plan.*has no "
                       "base_model_tp_plan.*dtensor-tp"):
        hf_tp_plan(build_model(name, device="meta"), 2)


def test_the_plan_is_hfs_with_layer_numbers_and_a_tied_head_left_to_the_embedding():
    from end2end.driver.baselines.hf_tp import hf_tp_plan

    plan = hf_tp_plan(build_model("tiny/mixtral", device="meta"), 2)
    assert plan["model.layers.1.self_attn.q_proj"] == "colwise"
    assert plan["model.layers.0.mlp.experts"] == "moe_tp_experts"
    assert plan["lm_head"] == "colwise_gather_output"
    assert plan["model.embed_tokens"] == "embedding_rowwise"
    gemma = hf_tp_plan(build_model("tiny/gemma3", device="meta"), 2)
    assert gemma["lm_head"] == "colwise_gather_output" and "lm_head.weight" not in gemma
