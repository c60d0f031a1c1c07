"""Trace-by-need: traced modules compute the same outputs and gradients as eager, at the traced
shape and at another batch/sequence size, keep their paths, state_dict keys and hooks."""

import pytest
import torch
import torch.fx as fx
from torch import nn

import slapo
from slapo.testing import assert_same_training, example_inputs, tiny_model

CASES = [
    ("bert", "bert.encoder.layer.0", []),
    ("bert", "bert.encoder.layer.1.attention", []),
    ("roberta", "roberta.encoder.layer.0", []),
    ("gpt2", "transformer.h.0.attn", ["Conv1D"]),
    ("gpt2", "transformer.h.1", ["Conv1D"]),
    ("gpt_neo", "transformer.h.0.attn.attention", []),
    ("gpt_neo", "transformer.h.1.attn.attention", []),  # local attention
    ("opt", "model.decoder.layers.0", []),
    ("t5", "encoder.block.0", []),
    ("t5", "decoder.block.1", []),  # traced with use_cache=False (see below)
    ("llama", "model.layers.0.self_attn", []),
    ("llama", "model.layers.1", []),
]


@pytest.mark.parametrize("family,path,leaves", CASES, ids=[f"{f}:{p}" for f, p, _ in CASES])
def test_traced_module_matches_eager(family, path, leaves):
    # EncoderDecoderCache cannot be deep-copied (transformers bug), so T5's decoder is traced
    # without a cache, as in training.
    config = dict(use_cache=False) if path.startswith("decoder") else {}
    ref, model = tiny_model(family, **config), tiny_model(family, **config)
    sch = slapo.create_schedule(model)
    gm = sch[path].trace(example_inputs=example_inputs(family), leaves=leaves)
    assert isinstance(gm, fx.GraphModule) and model.get_submodule(path) is gm
    assert list(model.state_dict()) == list(ref.state_dict())
    for name, _ in ref.get_submodule(path).named_modules():  # every path survives
        assert f"{path}.{name}" if name else path in sch
    assert_same_training(ref, model, example_inputs(family))
    assert_same_training(ref, model, example_inputs(family, batch=3, seq=5))


class Bottleneck(nn.Module):
    """torchvision-style ResNet bottleneck (WideResNet: width_per_group=128)."""

    expansion = 4

    def __init__(self, inplanes=16, planes=4, width_per_group=128):
        super().__init__()
        width = int(planes * (width_per_group / 64.0))
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + x)


def test_wide_resnet_bottleneck():
    torch.manual_seed(0)
    ref = nn.Sequential(Bottleneck(), Bottleneck())
    model = nn.Sequential(Bottleneck(), Bottleneck())
    model.load_state_dict(ref.state_dict())
    sch = slapo.create_schedule(model)
    sch["1"].trace(example_inputs=(torch.randn(2, 16, 8, 8),))
    assert isinstance(sch["1"].mod, fx.GraphModule) and "1.conv2" in sch
    for shape in [(2, 16, 8, 8), (3, 16, 5, 7)]:
        assert_same_training(ref, model, (torch.randn(shape),))


def test_recursive_trace_keeps_hierarchy_and_hooks():
    model = tiny_model("bert")
    calls = []
    model.bert.encoder.layer[0].attention.register_forward_hook(lambda *a: calls.append(1))
    sch = slapo.create_schedule(model)
    sch["bert.encoder.layer.0.attention"].trace(example_inputs=example_inputs("bert"))
    assert isinstance(sch["bert.encoder.layer.0.attention.self"].mod, fx.GraphModule)
    assert isinstance(sch["bert.encoder.layer.0.attention.self.query"].mod, nn.Linear)
    assert not isinstance(sch["bert.encoder.layer.1"].mod, fx.GraphModule)  # untouched
    model(**example_inputs("bert"))
    assert calls == [1]
    # keyword call as the HF parent does; literal arguments are guarded
    gm = sch["bert.encoder.layer.0.attention"].mod
    x = torch.randn(2, 8, 32)
    assert gm(hidden_states=x)[0].shape == x.shape


def test_checkpointed_children_are_leaves_and_trace_until():
    ref, model = tiny_model("bert"), tiny_model("bert")
    sch = slapo.create_schedule(model)
    sch["bert.encoder.layer.0"].checkpoint()
    sch.trace_until("bert.encoder", example_inputs=example_inputs("bert"))
    assert isinstance(sch["bert.encoder"].mod, fx.GraphModule)
    assert not isinstance(sch["bert.encoder.layer.0"].mod, fx.GraphModule)
    assert not isinstance(sch["bert.embeddings"].mod, fx.GraphModule)
    assert_same_training(ref, model, example_inputs("bert", batch=3, seq=6))
    # replay of the history gives the same model
    again = sch.history.replay(tiny_model("bert"))
    assert isinstance(again["bert.encoder"].mod, fx.GraphModule)
    assert_same_training(ref, again.mod, example_inputs("bert"))


class Untraceable(nn.Module):
    SCALE = {1: 1.0, 2: 2.0, 3: 3.0}

    def forward(self, x):
        return x * self.SCALE[x.shape[0]]  # a symbolic size cannot be a dict key


def test_untraceable_construct_raises_trace_error():
    model = nn.Sequential(nn.Linear(4, 4), Untraceable())
    sch = slapo.create_schedule(model)
    with pytest.raises(slapo.TraceError, match=r"'1'.*SCALE\[x.shape\[0\]\].*KeyError"):
        sch["1"].trace(example_inputs=(torch.randn(2, 4),))


def test_trace_errors():
    sch = slapo.create_schedule(tiny_model("bert"))
    with pytest.raises(slapo.TraceError, match="no inputs.*Hint: pass example_inputs"):
        sch["bert.encoder"].trace()
    with pytest.raises(slapo.TraceError, match="not a module below"):
        sch["bert"].trace_until("cls")
    model = tiny_model("gpt2")
    sch = slapo.create_schedule(model)
    with pytest.raises(slapo.TraceError, match="use_cache = False"):
        sch["transformer"].trace(example_inputs=example_inputs("gpt2"))


def test_guard_on_specialised_argument():
    model = tiny_model("bert")
    sch = slapo.create_schedule(model)
    gm = sch["bert.encoder.layer.0.attention.self"].trace(example_inputs=example_inputs("bert"))
    with pytest.raises(slapo.TraceError, match="when the module was traced"):
        gm(torch.randn(2, 8, 32), position_ids=torch.arange(8))


class TypeChecks(nn.Module):
    """``isinstance`` on traced values: a proxy must answer as its value does (a plain proxy is
    neither a tensor nor a tuple, and these branches used to be dropped silently)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)
        self.register_buffer("shift", torch.full((16,), 0.5))

    def forward(self, x):
        h = self.fc1(x)
        if isinstance(h, torch.Tensor):
            h = h * 2.0
        if not isinstance(h, (tuple, list, dict, int)):
            h = h + 1.0
        parts = h.chunk(2, dim=-1)  # a traced tuple
        if isinstance(parts, (tuple, list)):
            h = torch.cat([parts[1], parts[0]], dim=-1)
        if isinstance(x.shape, torch.Size) and isinstance(x.shape[0], int):
            h = h - 0.25
        if torch.is_tensor(h):  # and C code must still see a proxy, not a tensor
            h = torch.where(h > 0.5, h, 0.0)
        w = self.fc2.weight  # fc2 is a leaf, but its weight read here is a traced attribute
        if isinstance(w, nn.Parameter) and not isinstance(self.shift, nn.Parameter):
            h = h + self.shift
        return self.fc2(torch.tanh(h)) + (w.sum() if isinstance(w, torch.Tensor) else 0.0)


def test_isinstance_on_traced_values_matches_eager():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 8), TypeChecks())
    model = nn.Sequential(nn.Linear(8, 8), TypeChecks())
    model.load_state_dict(ref.state_dict())
    sch = slapo.create_schedule(model)
    gm = sch["1"].trace(example_inputs=(torch.randn(2, 4, 8),))
    targets = [n.target for n in gm.graph.nodes]
    assert "chunk" in targets and torch.cat in targets and torch.where in targets
    for shape in [(2, 4, 8), (3, 5, 8)]:  # outputs and gradients, at another shape too
        assert_same_training(ref, model, (torch.randn(shape),))
