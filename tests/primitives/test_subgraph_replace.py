"""find + replace/checkpoint of subgraphs in traced modules: numerics, paths, replay, errors."""

import pytest
import torch
from torch import nn

import slapo
from slapo.testing import assert_same_training, example_inputs, tiny_model


class FusedQKV(nn.Module):
    """One linear computing q, k and v (returned as a tuple)."""

    def __init__(self, q, k, v):
        super().__init__()
        self.sizes = [q.out_features, k.out_features, v.out_features]
        self.fused = nn.Linear(q.in_features, sum(self.sizes), bias=q.bias is not None)
        with torch.no_grad():
            self.fused.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
            if q.bias is not None:
                self.fused.bias.copy_(torch.cat([q.bias, k.bias, v.bias]))

    def forward(self, x):
        return tuple(self.fused(x).split(self.sizes, dim=-1))


QKV = [("bert", "bert.encoder.layer.0.attention.self", ("query", "key", "value")),
       ("llama", "model.layers.0.self_attn", ("q_proj", "k_proj", "v_proj"))]


@pytest.mark.parametrize("family,att,names", QKV, ids=[c[0] for c in QKV])
def test_fuse_qkv_horizontally(family, att, names):
    ref, model = tiny_model(family), tiny_model(family)
    sch = slapo.create_schedule(model)
    sch[att].trace(example_inputs=example_inputs(family))
    found = sch[att].find(r"(%s)$" % "|".join(names))
    assert [sg.nodes[0].target for sg in found] == list(names)
    sch[att].replace(FusedQKV(*[sch[att].mod.get_submodule(n) for n in names]), found)
    assert f"{att}.FusedQKV_0.fused" in sch and f"{att}.{names[0]}" not in sch
    old = [f"{att}.{n}.{p}" for n in names for p in ("weight", "bias")]
    assert_same_training(ref, model, example_inputs(family), ignore=old)
    assert_same_training(ref, model, example_inputs(family, batch=3, seq=5), ignore=old)
    replayed = sch.history.replay(tiny_model(family))
    assert_same_training(ref, replayed.mod, example_inputs(family), ignore=old)


def test_checkpoint_subgraph_keeps_paths():
    ref, model = tiny_model("bert"), tiny_model("bert")
    sch = slapo.create_schedule(model)
    sch["bert.encoder.layer.1.attention"].trace(example_inputs=example_inputs("bert"))
    found = sch["bert.encoder.layer.1.attention.self"].find("query")
    name = sch["bert.encoder.layer.1.attention.self"].checkpoint(found[0])
    assert name == "checkpoint_0"
    assert list(model.state_dict()) == list(ref.state_dict())
    assert_same_training(ref, model, example_inputs("bert"))


def test_replace_with_wrong_arity_leaves_nothing_registered():
    model = tiny_model("bert")
    sch = slapo.create_schedule(model)
    p = "bert.encoder.layer.0.attention.self"
    sch[p].trace(example_inputs=example_inputs("bert"))
    found = sch[p].find(r"query$")

    class TwoInputs(nn.Module):
        def forward(self, a, b):
            return a + b

    with pytest.raises(slapo.ReplaceError, match=f"on '{p}'.*cannot be called.*Hint"):
        sch[p].replace(TwoInputs(), found)
    assert not hasattr(sch[p].mod, "TwoInputs_0")
    sch[p].replace(nn.Linear(32, 32), found)  # the same subgraph still works
    assert hasattr(sch[p].mod, "Linear_0")
    with pytest.raises(slapo.ReplaceError, match="stale"):
        sch[p].replace(nn.Linear(32, 32), found)
