"""``apply_schedule(model, "wideresnet", fuse_conv_bn=True)``: every conv+BN pair folded for
inference. Eval-mode outputs equal the unfused model (fp64 tight, fp32 looser) at TP=1 and TP=2
(one 2-rank spawn); a model in training mode is refused."""

import copy

import pytest
import torch
from torch import nn

from slapo.errors import ConfigError
from slapo.model_schedule import apply_schedule
from slapo.op.conv_bn import ChannelBias
from slapo.testing import run_distributed
from tests.model_schedule.helpers import wideresnet, wideresnet_inputs

TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-4, atol=1e-4)}


def trained_wideresnet(dtype=torch.float64) -> nn.Module:
    """The tiny WideResNet with non-trivial BatchNorm statistics and affine parameters, in eval
    mode (a fresh BatchNorm folds to the identity and would hide mistakes)."""
    model = wideresnet()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g, dtype=torch.float64) * 0.5)
                m.running_var.copy_(torch.rand(n, generator=g, dtype=torch.float64) + 0.5)
                m.weight.copy_(torch.randn(n, generator=g, dtype=torch.float64))
                m.bias.copy_(torch.randn(n, generator=g, dtype=torch.float64))
    return model.to(dtype).eval()


def _inputs(dtype):
    return wideresnet_inputs()["pixel_values"].to(dtype)


def _compare(dtype, group=None, **knobs):
    """(max abs difference of the logits, #BatchNorms left, #ChannelBias) after fusing."""
    ref = trained_wideresnet(dtype)
    model = copy.deepcopy(ref)
    apply_schedule(model, "wideresnet", group=group, fuse_conv_bn=True, **knobs)
    x = _inputs(dtype)
    with torch.no_grad():
        want, got = ref(x).logits, model(x).logits
    torch.testing.assert_close(got, want, **TOL[dtype])
    bns = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    biases = sum(isinstance(m, ChannelBias) for m in model.modules())
    return (got - want).abs().max().item(), bns, biases


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tp1_fused_matches_unfused(dtype):
    diff, bns, biases = _compare(dtype)
    assert bns == 0 and biases == 0
    assert diff <= TOL[dtype]["atol"] * 10


def test_tp1_fused_with_checkpointing_and_gradients_enabled():
    ref = trained_wideresnet()
    model = copy.deepcopy(ref)
    sch = apply_schedule(model, "wideresnet", fuse_conv_bn=True, ckpt_ratio=1.0)
    x = _inputs(torch.float64)
    torch.testing.assert_close(model(x).logits, ref(x).logits, **TOL[torch.float64])
    conv = sch["model.layer1.0.conv1"].mod
    assert conv.bias is not None and isinstance(sch["model.layer1.0.bn1"].mod, nn.Identity)
    assert isinstance(sch["model.layer2.0.downsample.1"].mod, nn.Identity)
    assert isinstance(sch["model.bn1"].mod, nn.Identity)


def test_training_mode_is_refused():
    model = trained_wideresnet().train()
    with pytest.raises(ConfigError, match=r"training mode.*batch statistics.*Hint: call "
                                          r"model\.eval\(\)"):
        apply_schedule(model, "wideresnet", fuse_conv_bn=True)
    # one BatchNorm left in training mode is enough to refuse, and is named
    model.eval()
    model.model.layer2[0].bn2.train()
    with pytest.raises(ConfigError, match=r"'model\.layer2\.0\.bn2'"):
        apply_schedule(model, "wideresnet", fuse_conv_bn=True)
    # a model in training mode without the knob is scheduled as before
    apply_schedule(trained_wideresnet().train(), "wideresnet")


def test_unknown_knob_still_refused():
    with pytest.raises(ConfigError, match="did you mean 'fuse_conv_bn'"):
        apply_schedule(trained_wideresnet(), "wideresnet", fuse_conv_bnn=True)


def _tp2():
    torch.set_num_threads(1)
    return [_compare(torch.float64), _compare(torch.float32),
            _compare(torch.float64, ckpt_ratio=1.0)]


def test_tp2_fused_matches_unfused():
    results = run_distributed(_tp2, 2, timeout=300)
    for rank in results:
        for _diff, bns, biases in rank:
            assert bns == 0
            assert biases == 5  # conv2 of each of the 5 blocks: bias after the all-reduce
