"""Pipeline cuts crossed by nested values (LLaMA's rotary ``(cos, sin)``, GPT-Neo's and T5's
layer output tuples): the stages pass them as flat tensors and rebuild them, and the pipelined
model trains like the unpipelined HF model, in process, as DeepSpeed layers, and on 2 gloo ranks
through ``PipelineRunner``."""

import copy

import pytest
import torch

import slapo
from slapo.dialects.deepspeed_pipeline import deepspeed_stage
from slapo.model_schedule import apply_schedule
from slapo.pipeline import build_pipeline_stages
from slapo.pipeline.values import FlattenTree, RebuildTree, crossing
from slapo.testing import example_inputs, run_distributed, tiny_model
from tests.pipeline.helpers import train_stage_like_reference
from tests.model_schedule.helpers import compare_training

LAYERS = {"gpt_neo": dict(num_layers=4, attention_types=[[["global", "local"], 2]]),
          "llama": dict(num_hidden_layers=4), "t5": dict(use_cache=False)}


PATHS = {"gpt_neo": ("transformer", "transformer.h.1"), "llama": ("model", "model.layers.1"),
         "t5": (["encoder", "decoder"], "decoder.block.0")}


def _pipelined(family, recipe=True):
    """(HF reference, a copy cut after layer 1, its two stages). ``recipe``: the model schedule
    (op-library attention ...); else only traced and cut (HF modules and parameter names)."""
    ref = tiny_model(family, **LAYERS[family])
    model = copy.deepcopy(ref)
    inputs = example_inputs(family, batch=4)
    if recipe:
        sch = apply_schedule(model, family, pipeline_cuts=[1], example_inputs=inputs)
    else:
        model.config.use_cache = False
        sch = slapo.create_schedule(model)
        parent, cut = PATHS[family]
        sch.trace_until(parent, example_inputs=inputs)
        sch[cut].cut_pipeline_stage()
    return ref, model, build_pipeline_stages(sch)


@pytest.mark.parametrize("family", ["gpt_neo", "llama"])
def test_two_stages_train_like_the_hf_model(family):
    ref, model, stages = _pipelined(family)
    assert len(stages) == 2
    keys = [k for s in stages for k in s.state_dict()]
    assert sorted(keys) == sorted(model.state_dict())
    rebuilt = [n for n in stages[1].graph.nodes if isinstance(n.target, RebuildTree)]
    assert rebuilt, "a nested value should cross the cut"
    model.forward = lambda **kw: stages[1](*stages[0](**kw))  # chain the stages in process
    compared = compare_training(ref, model, example_inputs(family, batch=3, seq=6))
    assert compared >= len(list(model.parameters())) // 2


def test_nested_values_flatten_and_rebuild():
    value = ((torch.ones(2), None), [3, "x", (torch.Size([2, 5]), True)], {"a": 1.5})
    how = crossing(value)
    assert how.kind == "tree" and how.num_tensors >= 5  # tensor, 3, Size (1 or 2), True, 1.5
    flat = FlattenTree("v", how)(value)
    assert all(isinstance(t, torch.Tensor) for t in flat)
    back = RebuildTree("v", how)(*flat)
    assert back[1] == [3, "x", (torch.Size([2, 5]), True)] and back[2] == {"a": 1.5}
    assert back[0][1] is None and torch.equal(back[0][0], value[0][0])
    other = ((torch.ones(2), None), [4, "x", (torch.Size([7, 5]), False)], {"a": 2.5})
    assert RebuildTree("v", how)(*FlattenTree("v", how)(other))[1][2] == (torch.Size([7, 5]),
                                                                            False)
    with pytest.raises(slapo.PipelineError, match="'v' crossing a cut is"):
        FlattenTree("v", how)(((torch.ones(2),), [3, "x", (torch.Size([2, 5]), True)], {}))
    with pytest.raises(slapo.PipelineError, match="holds 'y' now but held 'x'"):
        FlattenTree("v", how)(((torch.ones(2), None), [3, "y", (torch.Size([2, 5]), 1)],
                               {"a": 1.0}))
    with pytest.raises(slapo.PipelineError, match="holds a int where it held a tensor"):
        FlattenTree("v", how)(((1, None), [3, "x", (torch.Size([2, 5]), 1)], {"a": 1.0}))
    assert crossing((torch.ones(1), object())) is None


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_deepspeed_layers_carry_nested_values(family):
    """DeepSpeed layers (tuple in, encoded tuple out) chain to the HF loss."""
    ref, _, stages = _pipelined(family, recipe=False)
    names = ["input_ids", "attention_mask", "labels"]
    layers = [deepspeed_stage(st, names, loss_in_stage=True) for st in stages]
    inputs = example_inputs(family, batch=3, seq=6)
    # as DeepSpeed receives activations: detached, every floating tensor requiring a gradient,
    # and it asserts after backward that each of them got one (T5's layer output tuple carries
    # the position bias across the cut, which the next stage does not use)
    received = tuple(t.detach().requires_grad_(t.is_floating_point())
                     for t in layers[0](tuple(inputs[n] for n in names)))
    loss = layers[1](received)
    torch.testing.assert_close(loss, ref(**inputs).loss)
    loss.backward()
    assert all(t.grad is not None for t in received if t.requires_grad)


def _train_on_ranks(family, schedule, steps=2):
    ref, _, stages = _pipelined(family, recipe=False)
    return train_stage_like_reference(ref, stages, family, schedule, steps)


def _train_all():
    return {family: _train_on_ranks(family, schedule)
            for family, schedule in [("gpt_neo", "gpipe"), ("llama", "1f1b"), ("t5", "gpipe")]}


def test_nested_values_cross_ranks_with_pipeline_runner():
    results = run_distributed(_train_all, 2, timeout=300)
    for family in ("gpt_neo", "llama", "t5"):
        assert results[0][family] == [None] * 2
        assert all(isinstance(x, float) for x in results[1][family])
