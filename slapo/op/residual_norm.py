"""The epilogue of a transformer sub-layer, fused: ``LayerNorm(residual + dropout(x @ W.T + b))``.

HF BERT and RoBERTa end the attention (``attention.output``) and the FFN (``output``) with a
``dense`` Linear, dropout, the residual add and a LayerNorm. :class:`DenseDropoutResidualNorm`
does the same with the dense layer's bias *decomposed* out of the Linear (``dense`` has no bias;
the module's own ``bias`` is added in the epilogue), so the bias add, dropout, residual add and
LayerNorm are one element-wise chain that ``torch.compile`` fuses into one kernel
(:func:`slapo.op.fused.bias_dropout_residual_layer_norm`). The decomposition also makes the
row-parallel form exact for free: under tensor parallelism ``dense`` is sharded on its input
axis and its partial output all-reduced (a plain ``sync``), and the bias is added once, after.

Parameter names stay the HF ones (``dense.weight``, ``LayerNorm.weight``/``.bias``) except the
bias, ``dense.bias`` -> ``bias``, recorded as provenance so ``slapo.verify`` compares it.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import OpError
from ..provenance import record_provenance, same
from .fused import Compile, _check_p, bias_dropout_residual_layer_norm

__all__ = ["DenseDropoutResidualNorm", "residual_norm_from_hf"]


class DenseDropoutResidualNorm(nn.Module):
    """``forward(hidden_states, input_tensor) = LayerNorm(input_tensor + dropout(dense(
    hidden_states) + bias))`` (BERT's ``SelfOutput``/``Output`` signature), eager or compiled."""

    def __init__(self, in_features: int, out_features: int, p: float = 0.0,
                 eps: float = 1e-12, compile: Compile = None):
        super().__init__()
        self.dense = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.LayerNorm = nn.LayerNorm(out_features, eps=eps)
        self.p = _check_p(p, "DenseDropoutResidualNorm")
        self.compile = compile

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        ln = self.LayerNorm
        return bias_dropout_residual_layer_norm(
            self.dense(hidden_states), self.bias, input_tensor, self.p, self.training,
            ln.weight, ln.bias, ln.eps, compile=self.compile)

    def extra_repr(self) -> str:
        return f"p={self.p}, compile={self.compile!r}"


_SUPPORTED = {"BertSelfOutput", "BertOutput", "RobertaSelfOutput", "RobertaOutput"}


def residual_norm_from_hf(module: nn.Module, *, compile: Compile = None
                          ) -> DenseDropoutResidualNorm:
    """The fused epilogue replacing HF ``module`` (``BertSelfOutput``, ``BertOutput`` and the
    RoBERTa ones: ``{bert,roberta}.encoder.layer.N.attention.output`` / ``.output``), weights
    copied, provenance of the moved bias recorded.

    Raises:
        OpError: another module type, or a dense layer without a bias.
    """
    names = {c.__name__ for c in type(module).__mro__}
    if not names & _SUPPORTED:
        raise OpError(f"no fused residual+LayerNorm epilogue for {type(module).__name__}",
                      call="residual_norm_from_hf", module=module,
                      hint=f"supported: {', '.join(sorted(_SUPPORTED))}")
    dense, ln = module.dense, module.LayerNorm
    if dense.bias is None:
        raise OpError("the dense layer has no bias to decompose", call="residual_norm_from_hf",
                      module=module)
    new = DenseDropoutResidualNorm(dense.in_features, dense.out_features, module.dropout.p,
                                   ln.eps, compile=compile)
    with torch.no_grad():
        new.dense.weight.copy_(dense.weight)
        new.bias.copy_(dense.bias)
        new.LayerNorm.load_state_dict(ln.state_dict())
    record_provenance(new, "dense.bias", "bias", same)
    return new.to(device=dense.weight.device, dtype=dense.weight.dtype).train(module.training)
