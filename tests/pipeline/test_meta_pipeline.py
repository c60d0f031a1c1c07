"""Delayed-init (meta) models trace, ``trace_until`` and cut into pipeline stages without
materialising a weight; materialised afterwards, the stages compute what the unscheduled model
materialised the same way computes (outputs and gradients), in process and on 2 gloo ranks, where
``slapo.build(sch, init_weights=True)`` of the traced, cut meta model trains like it too."""

import copy

import pytest
import torch
import transformers as tf

import slapo
from slapo.pipeline import build_pipeline_stages
from slapo.testing import example_inputs, run_distributed, tiny_config
from slapo.testing.models import _MODEL_CLASS
from tests.pipeline.helpers import train_stage_like_reference

CONFIG = {
    "gpt_neo": dict(num_layers=4, attention_types=[[["global", "local"], 2]], use_cache=False),
    "gpt2": dict(n_layer=4, use_cache=False),
    "bert": dict(num_hidden_layers=4),
    "opt": dict(num_hidden_layers=4, use_cache=False),
    "llama": dict(num_hidden_layers=4, use_cache=False),
    "t5": dict(num_layers=4, num_decoder_layers=4, use_cache=False),
}
PARENT = {"gpt_neo": "transformer", "gpt2": "transformer", "bert": "bert.encoder",
          "opt": "model.decoder", "llama": "model", "t5": ["encoder", "decoder"]}
LAYERS = {"gpt_neo": "transformer.h", "gpt2": "transformer.h", "bert": "bert.encoder.layer",
          "opt": "model.decoder.layers", "llama": "model.layers"}


def _cuts(family, stages):
    if family == "t5":
        return {2: ["encoder.block.3"],
                4: ["encoder.block.1", "encoder.block.3", "decoder.block.1"]}[stages]
    return [f"{LAYERS[family]}.{i}" for i in {2: [1], 4: [0, 1, 2]}[stages]]


def meta_model(family):
    with slapo.init_empty_weights():
        return getattr(tf, _MODEL_CLASS[family])(tiny_config(family, **CONFIG[family]))


def _all_meta(*modules):
    tensors = [t for m in modules for t in list(m.parameters())]
    return bool(tensors) and all(t.is_meta for t in tensors)


def staged_meta(family, stages):
    """(a meta reference, the meta model's schedule, its stages), nothing materialised."""
    model = meta_model(family)
    ref = copy.deepcopy(model)
    sch = slapo.create_schedule(model)
    sch.trace_until(PARENT[family], example_inputs=example_inputs(family, batch=4))
    for cut in _cuts(family, stages):
        sch[cut].cut_pipeline_stage()
    return ref, sch, build_pipeline_stages(sch)


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("family", list(CONFIG))
def test_meta_model_cuts_into_stages_that_match_once_materialised(family, stages):
    ref, sch, parts = staged_meta(family, stages)
    assert len(parts) == stages
    assert _all_meta(sch.mod, *parts), "tracing or cutting materialised a weight"
    keys = {k for s in parts for k in s.state_dict()}
    assert keys <= set(ref.state_dict())  # original names (T5's tied `shared` is reached as
    assert {id(p) for s in parts for p in s.parameters()} == {  # `encoder.embed_tokens`)
        id(p) for p in sch.mod.parameters()}
    slapo.materialize(sch, True, device="cpu", seed=3)
    slapo.materialize(ref, True, device="cpu", seed=3)
    ref.eval()
    for s in parts:
        s.eval()
    inputs = example_inputs(family, batch=3, seq=6)
    out = parts[0](**inputs)
    for s in parts[1:]:
        out = s(*out)
    ref_out = ref(**inputs)
    torch.testing.assert_close(out.loss, ref_out.loss)
    out.loss.backward()
    ref_out.loss.backward()
    mine = dict(sch.mod.named_parameters())
    for name, p in ref.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(mine[name].grad, p.grad, msg=name)


def test_trace_of_a_submodule_of_a_meta_model_keeps_it_on_meta():
    model = meta_model("gpt_neo")
    sch = slapo.create_schedule(model)
    gm = sch["transformer.h.1"].trace(example_inputs=example_inputs("gpt_neo"))
    assert isinstance(gm, torch.fx.GraphModule)
    assert any(n.op == "call_module" for n in gm.graph.nodes)
    assert _all_meta(model) and not any(b.is_meta for b in model.buffers())


def _train_meta_on_ranks():
    out = {}
    for family, schedule in [("gpt_neo", "gpipe"), ("llama", "1f1b")]:
        ref, sch, parts = staged_meta(family, 2)
        assert _all_meta(sch.mod, *parts)
        slapo.materialize(sch, True, device="cpu", seed=5)
        slapo.materialize(ref, True, device="cpu", seed=5)
        out[family] = train_stage_like_reference(ref.train(), parts, family, schedule, steps=2)
    # the user's path: build() materialises the traced, cut meta model and runs this rank's stage
    ref, sch, _ = staged_meta("gpt_neo", 2)
    model, _ = slapo.build(sch, init_weights=True, device="cpu", init_seed=7, n_microbatches=2)
    slapo.materialize(ref, True, device="cpu", seed=7)
    batch = example_inputs("gpt_neo", batch=4, seq=8)
    out["build"] = (model.train_step(batch), ref(**batch).loss.item())
    return out


def test_meta_pipeline_trains_like_the_unpipelined_model_on_2_ranks():
    results = run_distributed(_train_meta_on_ranks, 2, timeout=300)
    for family in ("gpt_neo", "llama"):
        assert results[0][family] == [None, None]
        assert all(loss is not None for loss in results[1][family])
    for r in results:  # the first step's loss is the unscheduled model's, on every rank
        assert r["build"][0] == pytest.approx(r["build"][1], rel=1e-6)
