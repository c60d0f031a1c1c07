"""``slapo.op.conv_bn``: the folded convolution equals conv -> eval BatchNorm."""

import pytest
import torch
from torch import nn

from slapo.errors import OpError
from slapo.op import ChannelBias, fuse_conv_bn, fuse_conv_bn_split

CASES = [  # (conv kwargs, conv class, bn class, input shape)
    (dict(in_channels=4, out_channels=6, kernel_size=3), nn.Conv2d, nn.BatchNorm2d, (2, 4, 9, 9)),
    (dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1, bias=False),
     nn.Conv2d, nn.BatchNorm2d, (2, 4, 9, 9)),
    (dict(in_channels=6, out_channels=9, kernel_size=(3, 2), padding=(2, 1), dilation=2,
          groups=3), nn.Conv2d, nn.BatchNorm2d, (2, 6, 10, 8)),
    (dict(in_channels=4, out_channels=4, kernel_size=3, padding=1, groups=4,
          padding_mode="reflect"), nn.Conv2d, nn.BatchNorm2d, (1, 4, 7, 7)),
    (dict(in_channels=3, out_channels=5, kernel_size=3, stride=2), nn.Conv1d, nn.BatchNorm1d,
     (2, 3, 11)),
]


def _pair(conv_kw, conv_cls, bn_cls, dtype, seed=0, affine=True):
    torch.manual_seed(seed)
    conv = conv_cls(**conv_kw).to(dtype)
    bn = bn_cls(conv.out_channels, affine=affine, eps=1e-3).to(dtype)
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.3, 2.0)
        if affine:
            bn.weight.normal_()
            bn.bias.normal_()
    return conv.eval(), bn.eval()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_fused_matches_conv_then_bn(case, dtype, tol):
    conv_kw, conv_cls, bn_cls, shape = case
    for affine in (True, False):
        conv, bn = _pair(conv_kw, conv_cls, bn_cls, dtype, affine=affine)
        x = torch.randn(shape, dtype=dtype)
        want = bn(conv(x))
        fused = fuse_conv_bn(conv, bn)
        assert type(fused) is conv_cls and fused.bias is not None
        for attr in ("stride", "padding", "dilation", "groups", "padding_mode", "kernel_size",
                     "in_channels", "out_channels"):
            assert getattr(fused, attr) == getattr(conv, attr), attr
        assert fused.weight.dtype == dtype and not fused.training
        torch.testing.assert_close(fused(x), want, rtol=tol, atol=tol)
        w, b = fuse_conv_bn_split(conv, bn)
        assert w.bias is None and isinstance(b, ChannelBias)
        torch.testing.assert_close(b(w(x)), want, rtol=tol, atol=tol)


def test_inputs_are_not_modified():
    conv, bn = _pair(CASES[0][0], nn.Conv2d, nn.BatchNorm2d, torch.float32)
    before = [t.clone() for t in list(conv.state_dict().values()) + list(bn.state_dict().values())]
    fuse_conv_bn(conv, bn)
    after = list(conv.state_dict().values()) + list(bn.state_dict().values())
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_fold_is_computed_in_float64():
    # a float32 fold rounds the scale and the products differently (checked: not bit-equal)
    conv, bn = _pair(CASES[0][0], nn.Conv2d, nn.BatchNorm2d, torch.float32)
    ref64 = fuse_conv_bn(conv.double(), bn.double())
    conv, bn = conv.float(), bn.float()
    fused = fuse_conv_bn(conv, bn)
    assert torch.equal(fused.weight, ref64.weight.float())
    assert torch.equal(fused.bias, ref64.bias.float())


def test_refusals():
    conv, bn = _pair(CASES[0][0], nn.Conv2d, nn.BatchNorm2d, torch.float32)
    with pytest.raises(OpError, match="training mode.*Hint: call model.eval"):
        fuse_conv_bn(conv, bn.train())
    no_stats = nn.BatchNorm2d(6, track_running_stats=False).eval()
    with pytest.raises(OpError, match="no running statistics"):
        fuse_conv_bn(conv, no_stats)
    with pytest.raises(OpError, match="7 channels but the convolution produces 6"):
        fuse_conv_bn(conv, nn.BatchNorm2d(7).eval())
    with pytest.raises(OpError, match="expected an nn.BatchNorm"):
        fuse_conv_bn(conv, nn.LayerNorm(6))
    with pytest.raises(OpError, match="expected an nn.Conv"):
        fuse_conv_bn(nn.Linear(4, 6), nn.BatchNorm1d(6).eval())
