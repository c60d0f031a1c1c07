"""Dtypes, devices, config flags and module flags a trace bakes in (issue #39, item 2): after
tracing, a change the model code would have decided on differently either is followed (the read
happens inside a leaf, or the graph does not depend on it) or refuses with one line naming the
module, the value it was traced with and how to re-trace. Default tracer and dynamo; BERT,
GPT-2, LLaMA, T5 and toy modules on a stock ``PretrainedConfig``."""

import pytest
import torch
from torch import nn
from transformers import PretrainedConfig

import slapo
from slapo.testing import assert_same_training, example_inputs, tiny_model

RUN = dict(batch=3, seq=5)


def _refusal(model, inputs, match):
    with pytest.raises(slapo.TraceError, match=match) as e:
        model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    assert "\n" not in str(e.value)
    return str(e.value)


def _traced(family, path, **options):
    over = {} if family == "bert" else dict(use_cache=False)
    ref, model = tiny_model(family, **over), tiny_model(family, **over)
    slapo.create_schedule(model)[path].trace(example_inputs=example_inputs(family), **options)
    return ref, model


# ------------------------------------------------------------------ toys
class Flags(nn.Module):
    """Reads config flags at call time, as HF modules do."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if self.config.output_attentions:
            h = h * 2
        if getattr(self.config, "extra_flag", False):  # absent when traced
            h = h + 1
        return h


class DtypeBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if h.dtype == torch.float64:
            h = h.sin()
        return h.to(x.dtype) + torch.zeros((), dtype=torch.get_default_dtype())


class Holder(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


def _toy_pair(make):
    torch.manual_seed(0)
    ref, model = Holder(make()), Holder(make())
    model.load_state_dict(ref.state_dict())
    return ref, model


@pytest.mark.parametrize("tracer", ["fx", "dynamo"])
def test_config_flags_read_while_tracing_are_guarded(tracer):
    x = torch.randn(2, 4)
    config = PretrainedConfig()
    ref, model = _toy_pair(lambda: Flags(config))
    slapo.create_schedule(model)["inner"].trace(example_inputs=(x,), tracer=tracer)
    assert_same_training(ref, model, (x,))
    config.output_attentions = False  # the value it was traced with: still runs
    assert_same_training(ref, model, (x,))
    config.output_attentions = True
    _refusal(model, (x,), r"'inner'.* config.output_attentions = False .*but it is True now.*"
             r"Hint: set config.output_attentions before tracing")
    config.output_attentions = False
    config.extra_flag = True
    _refusal(model, (x,), r"config.extra_flag = <absent>")


def test_config_flags_read_inside_a_leaf_follow():
    x = torch.randn(2, 4)
    ref, model = _toy_pair(lambda: Flags(PretrainedConfig()))
    slapo.create_schedule(model).trace(example_inputs=(x,), leaves=["inner"])
    for flag in (False, True):
        for m in (ref, model):
            m.inner.config.output_attentions = flag
        assert_same_training(ref, model, (x,))


@pytest.mark.parametrize("tracer", ["fx", "dynamo"])
def test_dtype_decisions_and_default_dtype_are_guarded(tracer):
    x = torch.randn(2, 4)
    ref, model = _toy_pair(DtypeBranch)
    slapo.create_schedule(model)["inner"].trace(example_inputs=(x,), tracer=tracer)
    assert_same_training(ref, model, (x,))
    ref.double()
    model.double()
    baked = r"fc.dtype = torch.float32 \(read at .*`if h.dtype == torch.float64:`\) but it is " \
        r"torch.float64" if tracer == "fx" else \
        r"exported with input x of torch.float32 on cpu but it is torch.float64"
    _refusal(model, (x.double(),), baked)
    if tracer == "fx":
        ref.float()
        model.float()
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            _refusal(model, (x,), r"read torch.get_default_dtype\(\) = torch.float32")
        finally:
            torch.set_default_dtype(default)


# ------------------------------------------------------------------ HF families
CONFIG_FLIPS = [  # (family, path, trace options, where the decision was read)
    ("bert", "bert.encoder.layer.0.attention.self", dict(recursive=False, flatten=True),
     "modeling_bert.py"),
    ("bert", "bert.encoder.layer.0.attention.self", dict(tracer="dynamo"), "modeling_bert.py"),
    ("gpt2", "transformer.h.0.attn", dict(leaves=["Conv1D"], flatten=True), "modeling_gpt2.py"),
    ("llama", "model.layers.0", dict(flatten=True), "modeling_llama.py"),
    ("t5", "encoder.block.0", dict(flatten=True), "modeling_t5.py"),
]


@pytest.mark.parametrize("family,path,options,site", CONFIG_FLIPS,
                         ids=[f"{f[0]}-{f[2].get('tracer', 'fx')}" for f in CONFIG_FLIPS])
def test_attention_implementation_switched_after_tracing_is_refused(family, path, options,
                                                                    site):
    ref, model = _traced(family, path, **options)
    inputs = example_inputs(family, **RUN)
    assert_same_training(ref, model, inputs)
    for m in (ref, model):
        m.set_attn_implementation("eager")
    text = _refusal(model, inputs, rf"'{path}' was traced with config._attn_implementation = "
                    rf"'sdpa' \(read at {site}:\d+\) but it is 'eager' now")
    assert "Hint: set config._attn_implementation before tracing" in text


def test_attention_implementation_read_inside_a_leaf_follows():
    path = "bert.encoder.layer.0.attention"
    ref, model = _traced("bert", path, leaves=["self"])
    inputs = example_inputs("bert", **RUN)
    for impl in ("sdpa", "eager"):
        for m in (ref, model):
            m.set_attn_implementation(impl)
        assert_same_training(ref, model, inputs)


@pytest.mark.parametrize("family,path,options,flag", [
    ("bert", "bert.encoder", dict(flatten=True), "layer.0.gradient_checkpointing"),
    ("t5", "encoder.block.0", dict(flatten=True), "gradient_checkpointing"),
    ("llama", "model.layers.0", dict(flatten=True), "gradient_checkpointing"),
], ids=["bert-encoder", "t5-block", "llama-layer"])
def test_gradient_checkpointing_enabled_after_tracing_is_refused(family, path, options, flag):
    ref, model = _traced(family, path, **options)
    model.gradient_checkpointing_enable()
    _refusal(model, example_inputs(family, **RUN),
             rf"'{path}' was traced with {flag} = False but it is True now")


def test_gradient_checkpointing_of_leaf_layers_follows():
    ref, model = _traced("bert", "bert.encoder", leaves=["layer.0", "layer.1"])
    inputs = example_inputs("bert", **RUN)
    for m in (ref, model):
        m.gradient_checkpointing_enable()
    assert_same_training(ref, model, inputs)


@pytest.mark.parametrize("family,path,options,baked", [
    ("llama", "model.layers.0", dict(flatten=True),
     r"hidden_states.dtype = torch.float32 \(read at modeling_llama.py:\d+ `input_dtype"),
    ("t5", "encoder.block.0", dict(flatten=True),
     r"layer_norm_weight.dtype = torch.float32 \(read at modeling_t5.py:\d+ `if self.weight"),
    ("llama", "model.layers.0.mlp", dict(tracer="dynamo"),
     r"exported with input x of torch.float32 on cpu but it is torch.float64"),
], ids=["llama-fx", "t5-fx", "llama-dynamo"])
def test_other_dtype_after_tracing_is_refused(family, path, options, baked):
    ref, model = _traced(family, path, **options)
    model.double()
    _refusal(model, example_inputs(family, **RUN), baked)


@pytest.mark.parametrize("family,path,options", [
    ("bert", "bert.encoder.layer.0.attention.self", dict(recursive=False, flatten=True)),
    ("gpt2", "transformer.h.0.mlp", dict(leaves=["Conv1D"])),
], ids=["bert-attention", "gpt2-mlp"])
def test_other_dtype_is_followed_where_the_graph_does_not_depend_on_it(family, path, options):
    ref, model = _traced(family, path, **options)
    ref.double()
    model.double()
    assert_same_training(ref, model, example_inputs(family, **RUN))


@pytest.mark.parametrize("path,options,captured", [
    ("bert.encoder.layer.1.attention.self", dict(flatten=True), False),
    ("bert.encoder.layer.1.attention.self", dict(tracer="dynamo"), False),
    ("bert.encoder.layer.1.attention", dict(leaves=["self"]), True),
], ids=["fx-inlined", "dynamo", "fx-leaf"])
def test_output_capture_of_an_inlined_module_is_refused(path, options, captured):
    """HF collects attentions with forward hooks on the attention modules (by class): a traced
    attention has no call to hook, so asking for them must refuse, not return fewer."""
    ref, model = tiny_model("bert"), tiny_model("bert")
    for m in (ref, model):
        m.set_attn_implementation("eager")
    slapo.create_schedule(model)[path].trace(example_inputs=example_inputs("bert"), **options)
    inputs = example_inputs("bert", **RUN)
    assert_same_training(ref, model, inputs)
    for m in (ref, model):
        m.config.output_attentions = True
    if captured:
        torch.testing.assert_close(model(**inputs).attentions, ref(**inputs).attentions)
    else:
        _refusal(model, inputs, rf"'{path}' inlined the code of modules whose attentions HF "
                 "collects with forward hooks")


def test_a_copy_of_a_traced_model_checks_its_own_config():
    import copy

    ref, model = _traced("bert", "bert.encoder.layer.0", flatten=True)
    twin = copy.deepcopy(model)
    inputs = example_inputs("bert", **RUN)
    twin.set_attn_implementation("eager")
    _refusal(twin, inputs, r"config._attn_implementation = 'sdpa'")
    assert_same_training(ref, model, inputs)  # the original's config did not change


@pytest.mark.parametrize("path,options", [("model.layers.0", dict(flatten=True)),
                                          ("model", dict())], ids=["layer-flat", "model"])
def test_a_copy_of_a_traced_model_is_all_of_it(path, options):
    """fx's own deepcopy of a GraphModule keeps only what the graph names: the copy lost the
    bound ``gradient_checkpointing`` (and refused to run: "traced with gradient_checkpointing
    = False but it is <absent> now"), plain attributes, children the graph does not call and
    hooks. ``slapo.Verify`` snapshots the model with a deepcopy."""
    import copy

    ref, model = _traced("llama", path, **options)
    calls = []
    model.get_submodule(path).register_forward_hook(lambda *a: calls.append(1))
    twin = copy.deepcopy(copy.deepcopy(model))  # a copy of a copy too
    traced, copied = model.get_submodule(path), twin.get_submodule(path)
    assert copied.__dict__.keys() == traced.__dict__.keys()
    assert list(twin.state_dict()) == list(model.state_dict())
    assert [type(m).__name__ for m in copied.modules()] == \
        [type(m).__name__ for m in traced.modules()]
    assert_same_training(ref, twin, example_inputs("llama", **RUN), rtol=0.0, atol=0.0)
    assert calls == [1]  # the copy's hook ran
    twin.gradient_checkpointing_enable()  # the copy's flags are the copy's own
    _refusal(twin, example_inputs("llama", **RUN), r"gradient_checkpointing = False")
    assert_same_training(ref, model, example_inputs("llama", **RUN), rtol=0.0, atol=0.0)
