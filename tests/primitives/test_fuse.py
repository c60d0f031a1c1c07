"""decompose + fuse of bias+GeLU with aot_eager keeps numerics and parameter paths."""

import pytest
import torch.nn.functional as F
from torch import nn

import slapo
from slapo.testing import assert_same_training, example_inputs, tiny_model


def bias_gelu(x, bias):
    return F.gelu(x + bias)


def test_fuse_bias_gelu_after_decompose():
    ref, model = tiny_model("bert"), tiny_model("bert")
    sch = slapo.create_schedule(model)
    p = "bert.encoder.layer.0.intermediate"
    sch[p + ".dense"].decompose()
    sch[p].trace(example_inputs=example_inputs("bert"), flatten=True)
    found = sch[p].find(bias_gelu)
    assert len(found) == 1 and len(found[0]) == 2
    name = sch[p].fuse(found[0], compiler="aot_eager")
    assert name == "FusedModule_0"
    assert list(model.state_dict()) == list(ref.state_dict())
    assert_same_training(ref, model, example_inputs("bert"))


def test_fuse_errors():
    model = tiny_model("bert")
    sch = slapo.create_schedule(model)
    p = "bert.encoder.layer.0.intermediate"
    sch[p].trace(example_inputs=example_inputs("bert"))
    found = sch[p].find("dense")
    with pytest.raises(slapo.PrimitiveError, match="nothing to fuse"):
        sch[p].fuse(found[0], compiler=None)
    with pytest.raises(slapo.PrimitiveError, match="unknown compiler"):
        sch[p].fuse(found[0], compiler="TorchScript")


def test_decompose_numerics_and_errors():
    ref, model = tiny_model("bert"), tiny_model("bert")
    sch = slapo.create_schedule(model)
    sch["bert.encoder.layer.0.output"].trace(example_inputs=example_inputs("bert"))
    sch["bert.encoder.layer.0.output.dense"].decompose()  # expands the traced parent's node
    code = sch["bert.encoder.layer.0.output"].mod.code
    assert "linear" in code and "dense_bias" in code
    assert_same_training(ref, model, example_inputs("bert"))
    with pytest.raises(slapo.PrimitiveError, match="only nn.Linear"):
        sch["bert.encoder.layer.0.output.LayerNorm"].decompose()
    lin = nn.Linear(4, 8)
    lin.weight = nn.Parameter(lin.weight[:4])  # as after a shard on axis 0
    with pytest.raises(slapo.PrimitiveError, match="before shard"):
        slapo.create_schedule(nn.Sequential(lin))["0"].decompose()
