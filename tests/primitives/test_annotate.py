import pytest
import torch

import slapo
from slapo.testing import MLP, tiny_model


def test_annotate_sets_attribute_and_tag():
    sch = slapo.create_schedule(tiny_model("gpt2"))
    sch["transformer.ln_f"].annotate("weight", "replicated_param", True)
    assert sch.mod.transformer.ln_f.weight.replicated_param is True
    assert "replicated_param" in sch.param_tags
    assert sch["transformer.h.0"].param_tags is sch.param_tags
    assert sch["transformer.ln_f"].metadata["annotate"] == {"weight.replicated_param": True}


def test_annotate_nested_name_and_buffer():
    model = MLP()
    model.register_buffer("scale", torch.ones(1))
    sch = slapo.create_schedule(model)
    sch.annotate("fc1.bias", "foo", "bar")
    sch.annotate("scale", "foo", 1)
    assert model.fc1.bias.foo == "bar" and model.scale.foo == 1


def test_annotate_errors():
    sch = slapo.create_schedule(MLP())
    with pytest.raises(slapo.AnnotateError, match=r"on 'fc1'.*no parameter or buffer named "
                       r"'weigth'.*did you mean 'weight'"):
        sch["fc1"].annotate("weigth", "k", 1)
    with pytest.raises(slapo.AnnotateError, match="not a valid attribute name"):
        sch["fc1"].annotate("weight", "not valid", 1)
    with pytest.raises(slapo.AnnotateError, match="would overwrite a tensor attribute"):
        sch["fc1"].annotate("weight", "grad", 1)
