"""The ``dtensor-tp`` baseline's plans: every supported family's tiny HF model, parallelised
over 2 gloo ranks (sequence parallel where the family allows, and without), gives the
single-process loss and gradients (each rank's DTensor gradient gathered whole); unsupported
families are refused with the reason."""

import pytest
import torch

from slapo.errors import ConfigError
from slapo.testing import example_inputs, run_distributed, tiny_model

FAMILIES = ("bert", "roberta", "gpt_neo", "opt", "t5", "llama")
SP_FAMILIES = ("gpt_neo", "llama")  # sequence parallel by default; also checked without
TOL = dict(rtol=1e-5, atol=1e-6)


def _loss_and_grads(model, batch, ctx):
    with ctx:
        loss = model(**batch).loss
        loss.backward()
    grads = {n: None if p.grad is None else
             (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
             for n, p in model.named_parameters()}
    loss = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
    return loss.item(), grads


def _tp_runs():
    from torch.distributed.device_mesh import init_device_mesh

    from end2end.driver.baselines.dtensor_plans import apply_tp_plan, parallel_loss

    mesh = init_device_mesh("cpu", (2,))
    out = {}
    runs = [(f, f, True) for f in FAMILIES] + [(f"{f}/no-sp", f, False) for f in SP_FAMILIES]
    for key, family, sp in runs:
        model = apply_tp_plan(tiny_model(family, use_cache=False), family, mesh,
                              sequence_parallel=sp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # mixed DTensor / plain params
        out[key] = _loss_and_grads(model, example_inputs(family), parallel_loss())
        opt.step()
    return out


def test_plans_match_single_process_on_two_ranks():
    import contextlib

    results = run_distributed(_tp_runs, 2)
    for key in results[0]:
        family = key.split("/")[0]
        ref_loss, ref_grads = _loss_and_grads(tiny_model(family, use_cache=False),
                                              example_inputs(family), contextlib.nullcontext())
        for r in results:
            loss, grads = r[key]
            torch.testing.assert_close(loss, ref_loss, **TOL)
            assert grads.keys() == ref_grads.keys(), family
            for name, g in grads.items():
                assert (g is None) == (ref_grads[name] is None), f"{family} {name}"
                torch.testing.assert_close(g, ref_grads[name], **TOL,
                                           msg=lambda m, n=name, f=family: f"{f} {n}: {m}")


@pytest.mark.parametrize("family,why", [("gpt2", "Conv1D"), ("albert", "shared layer"),
                                        ("wideresnet", "convolutional")])
def test_unsupported_families_say_why(family, why):
    from end2end.driver.baselines.dtensor_plans import tp_plan

    with pytest.raises(ConfigError, match=f"does not support {family}: .*{why}"):
        tp_plan(torch.nn.Linear(2, 2), family)


def test_sequence_parallel_only_where_the_family_allows():
    from torch.distributed.tensor.parallel import SequenceParallel

    from end2end.driver.baselines.dtensor_plans import tp_plan

    def sp_norms(family, **kw):
        plan = tp_plan(tiny_model(family, use_cache=False), family, **kw)
        return sorted(k for k, v in plan.items() if isinstance(v, SequenceParallel))

    assert sp_norms("llama") == ["model.layers.0.input_layernorm",
                                 "model.layers.0.post_attention_layernorm",
                                 "model.layers.1.input_layernorm",
                                 "model.layers.1.post_attention_layernorm", "model.norm"]
    assert len(sp_norms("gpt_neo")) == 5
    assert sp_norms("llama", sequence_parallel=False) == []
    assert sp_norms("bert") == sp_norms("opt") == sp_norms("t5") == []
