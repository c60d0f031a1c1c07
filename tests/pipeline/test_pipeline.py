"""Pipeline cuts: stage partitioning keeps parameter paths; stages train on 2 gloo ranks with
the same loss and gradients as the unpipelined model."""

import pytest
import torch

import slapo
from slapo.pipeline import build_pipeline_stages, tied_parameters
from slapo.testing import example_inputs, run_distributed, tiny_model
from tests.pipeline.helpers import train_stage_like_reference

CASES = {
    "bert": (dict(num_hidden_layers=4), "bert.encoder", "bert.encoder.layer.1"),
    "gpt2": (dict(n_layer=4, use_cache=False), "transformer", "transformer.h.1"),
}


def _staged(family):
    config, parent, cut = CASES[family]
    model = tiny_model(family, **config)
    sch = slapo.create_schedule(model)
    sch.trace_until(parent, example_inputs=example_inputs(family, batch=4))
    sch[cut].cut_pipeline_stage()
    return model, build_pipeline_stages(sch)


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_stages_keep_parameter_paths_and_numerics(family):
    config, _, _ = CASES[family]
    ref = tiny_model(family, **config)
    model, stages = _staged(family)
    assert len(stages) == 2
    keys = [k for s in stages for k in s.state_dict()]
    assert set(keys) == set(ref.state_dict())
    ties = tied_parameters(stages)
    assert len(ties) == 1 and {s for s, _ in ties[0]} == {0, 1}
    inputs = example_inputs(family, batch=3, seq=6)
    ref_loss = ref(**inputs).loss
    ref_loss.backward()
    out = stages[1](*stages[0](**inputs))
    out.loss.backward()
    torch.testing.assert_close(out.loss, ref_loss)
    grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    mine = dict(model.named_parameters())
    for n, g in grads.items():
        torch.testing.assert_close(mine[n].grad, g, msg=n)


def _train_on_ranks(family, schedule, steps):
    config, _, _ = CASES[family]
    ref = tiny_model(family, **config)
    _, stages = _staged(family)
    return train_stage_like_reference(ref, stages, family, schedule, steps)


def _train_all():
    out = {}
    for family, schedule in [("bert", "gpipe"), ("gpt2", "1f1b")]:
        out[family] = _train_on_ranks(family, schedule, steps=3)
    return out


def test_pipeline_trains_like_the_unpipelined_model():
    results = run_distributed(_train_all, 2, timeout=300)
    for family in ("bert", "gpt2"):
        assert results[0][family] == [None] * 3
        assert all(isinstance(x, float) for x in results[1][family])


def test_cut_needs_a_traced_parent():
    sch = slapo.create_schedule(tiny_model("bert"))
    with pytest.raises(slapo.PipelineError, match="not traced.*Hint: call sch.trace_until"):
        sch["bert.encoder.layer.0"].cut_pipeline_stage()
    with pytest.raises(slapo.PipelineError, match="root"):
        sch.cut_pipeline_stage()
