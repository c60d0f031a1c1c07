"""Transformer feed-forward blocks and builders from HuggingFace MLPs.

* :class:`MLP`: ``fc_in -> activation -> fc_out -> dropout``. The activation is the caller's
  (a name, an ``nn.Module`` or a function) and is really used — the original ``FusedMLP``
  ignored it and always ran tanh-GeLU (reference-spec §9.11). With ``fuse_bias_gelu=True`` and a
  GeLU activation, ``fc_in`` is a :class:`~slapo.op.fused.LinearBiasGeLU` that applies the
  (same flavour of) GeLU with its bias add fused.
* :class:`GatedMLP`: LLaMA's ``down(act(gate(x)) * up(x))``.
* :func:`mlp_from_hf`: either of them from a HF MLP with the weights copied (GPT-2's Conv1D
  ``[in, out]`` weights are transposed), to ``replace`` it in a schedule. Renamed parameters
  (``c_fc``/``c_proj`` -> ``fc_in``/``fc_out``) are recorded for ``slapo.verify``
  (:mod:`slapo.provenance`).

Sharding: ``fc_in`` / ``gate_proj`` / ``up_proj`` are the column-parallel Linears (axis 0, bias
too), ``fc_out`` / ``down_proj`` the row-parallel ones (axis 1).
"""

from __future__ import annotations

import copy
from typing import Callable, Optional, Tuple, Union

import torch
from torch import nn

from ..errors import OpError
from .fused import Compile, LinearBiasGeLU
from .hf_provenance import record_linear

__all__ = ["MLP", "GatedMLP", "DenseActivation", "mlp_from_hf", "resolve_activation",
           "gelu_kind"]

Activation = Union[str, nn.Module, Callable[[torch.Tensor], torch.Tensor]]

_NAMED = {
    "gelu": lambda: nn.GELU(), "gelu_new": lambda: nn.GELU(approximate="tanh"),
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": lambda: nn.ReLU(), "silu": lambda: nn.SiLU(), "swish": lambda: nn.SiLU(),
    "tanh": lambda: nn.Tanh(),
}
# HF activation classes that compute exactly a GeLU flavour (erf, or the tanh approximation).
_HF_GELU = {"GELUActivation": "none", "NewGELUActivation": "tanh", "GELUTanh": "tanh",
            "PytorchGELUTanh": "tanh", "FastGELUActivation": "tanh"}


def resolve_activation(activation: Activation) -> Union[nn.Module, Callable]:
    """A module for a name in ``_NAMED`` (``"gelu"``, ``"gelu_new"``, ``"relu"``, ``"silu"``
    ...); modules and functions are returned as given."""
    if isinstance(activation, str):
        if activation not in _NAMED:
            raise OpError(f"unknown activation {activation!r}", call="MLP",
                          hint=f"use one of {', '.join(_NAMED)}, or pass a module or function")
        return _NAMED[activation]()
    if not callable(activation):
        raise OpError(f"activation must be a name, module or function, got "
                      f"{type(activation).__name__}", call="MLP")
    return activation


def gelu_kind(activation: Union[nn.Module, Callable]) -> Optional[str]:
    """``"none"`` (erf) or ``"tanh"`` if ``activation`` is a GeLU, else ``None``."""
    if isinstance(activation, nn.GELU):
        return activation.approximate
    if isinstance(activation, nn.Module):
        return _HF_GELU.get(type(activation).__name__)
    if activation is torch.nn.functional.gelu:
        return "none"
    return None


class MLP(nn.Module):
    """``dropout(fc_out(act(fc_in(x))))``.

    Args:
        activation: a name (see :func:`resolve_activation`), a module or a function.
        dropout: applied to the output (training mode only, as ``nn.Dropout``).
        fuse_bias_gelu: fuse ``fc_in``'s bias add into the GeLU (``fc_in`` becomes a
            :class:`~slapo.op.fused.LinearBiasGeLU` and ``act`` is ``None``); needs a GeLU
            activation and ``bias=True``.
        compile: the fused op's ``torch.compile`` setting (:mod:`slapo.op.fused`).
    """

    def __init__(self, hidden_size: int, intermediate_size: int,
                 activation: Activation = "gelu", *, dropout: float = 0.0, bias: bool = True,
                 fuse_bias_gelu: bool = False, compile: Compile = None):
        super().__init__()
        act = resolve_activation(activation)
        kind = gelu_kind(act)
        if fuse_bias_gelu:
            if kind is None or not bias:
                raise OpError(
                    f"fuse_bias_gelu needs a GeLU activation and a bias (got "
                    f"{getattr(act, '__name__', type(act).__name__)}, bias={bias})",
                    call="MLP", hint="drop fuse_bias_gelu for other activations")
            self.fc_in = LinearBiasGeLU(hidden_size, intermediate_size, kind, compile=compile)
            self.act = None
        else:
            self.fc_in = nn.Linear(hidden_size, intermediate_size, bias=bias)
            self.act = act
        self.fc_out = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = self.fc_in(hidden_states)
        if self.act is not None:
            x = self.act(x)
        return self.dropout(self.fc_out(x))


class GatedMLP(nn.Module):
    """``down_proj(act(gate_proj(x)) * up_proj(x))`` (LLaMA; SiLU by default)."""

    def __init__(self, hidden_size: int, intermediate_size: int,
                 activation: Activation = "silu", *, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act = resolve_activation(activation)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(hidden_states))
                              * self.up_proj(hidden_states))


class DenseActivation(nn.Module):
    """``act(dense(x))`` (BERT's ``intermediate``), keeping HF's parameter names
    (``dense.weight``, ``dense.bias``); with ``fuse_bias_gelu`` the GeLU and the bias add run
    fused inside ``dense`` (a :class:`~slapo.op.fused.LinearBiasGeLU`)."""

    def __init__(self, in_features: int, out_features: int, activation: Activation = "gelu",
                 *, fuse_bias_gelu: bool = True, compile: Compile = None):
        super().__init__()
        act = resolve_activation(activation)
        kind = gelu_kind(act)
        if fuse_bias_gelu and kind is None:
            raise OpError("fuse_bias_gelu needs a GeLU activation", call="DenseActivation",
                          hint="pass fuse_bias_gelu=False for other activations")
        if fuse_bias_gelu:
            self.dense = LinearBiasGeLU(in_features, out_features, kind, compile=compile)
            self.act = None
        else:
            self.dense = nn.Linear(in_features, out_features)
            self.act = act

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = self.dense(hidden_states)
        return x if self.act is None else self.act(x)


def _copy(dst: nn.Linear, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
    with torch.no_grad():
        dst.weight.copy_(weight)
        if bias is not None:
            dst.bias.copy_(bias)


def _linear_weights(m: nn.Module) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(weight [out, in], bias)`` of an ``nn.Linear`` or a HF ``Conv1D`` (``[in, out]``)."""
    if isinstance(m, nn.Linear):
        return m.weight, m.bias
    if type(m).__name__ == "Conv1D":
        return m.weight.t(), m.bias
    raise OpError(f"expected a Linear or Conv1D projection, got {type(m).__name__}",
                  call="mlp_from_hf", module=m)


def _finish(new: nn.Module, ref: torch.Tensor, hf: nn.Module) -> nn.Module:
    return new.to(device=ref.device, dtype=ref.dtype).train(hf.training)


def mlp_from_hf(module: nn.Module, *, fuse_bias_gelu: bool = False,
                compile: Compile = None) -> nn.Module:
    """The slapo MLP replacing HF MLP ``module``, weights copied, same activation.

    Supported: ``GPT2MLP`` (``transformer.h.N.mlp``), ``GPTNeoMLP`` (``transformer.h.N.mlp``),
    ``LlamaMLP`` (``model.layers.N.mlp``, -> :class:`GatedMLP`; ``fuse_bias_gelu`` does not
    apply), and ``BertIntermediate`` / ``RobertaIntermediate``
    (``{bert,roberta}.encoder.layer.N.intermediate`` -> :class:`DenseActivation`, same
    parameter names). BERT's FFN is split over ``intermediate`` and ``output`` (which adds the
    residual and normalises), so it is not replaced as one MLP.

    Raises:
        OpError: an unsupported module, or ``fuse_bias_gelu`` with a non-GeLU activation.
    """
    names = {c.__name__ for c in type(module).__mro__}
    if names & {"BertIntermediate", "RobertaIntermediate"}:
        dense = module.dense
        new = DenseActivation(dense.in_features, dense.out_features,
                              copy.deepcopy(module.intermediate_act_fn),
                              fuse_bias_gelu=fuse_bias_gelu, compile=compile)
        _copy(new.dense, dense.weight, dense.bias)
        return _finish(new, dense.weight, module)
    if "LlamaMLP" in names:
        if fuse_bias_gelu:
            raise OpError("fuse_bias_gelu does not apply to a gated SiLU MLP",
                          call="mlp_from_hf", module=module, hint="drop fuse_bias_gelu")
        g, u, d = module.gate_proj, module.up_proj, module.down_proj
        new = GatedMLP(g.in_features, g.out_features, copy.deepcopy(module.act_fn),
                       bias=g.bias is not None)
        for dst, src in ((new.gate_proj, g), (new.up_proj, u), (new.down_proj, d)):
            _copy(dst, src.weight, src.bias)
        return _finish(new, g.weight, module)
    if names & {"GPT2MLP", "GPTNeoMLP"}:
        w_in, b_in = _linear_weights(module.c_fc)
        w_out, b_out = _linear_weights(module.c_proj)
        new = MLP(w_in.shape[1], w_in.shape[0], copy.deepcopy(module.act),
                  dropout=module.dropout.p, bias=b_in is not None,
                  fuse_bias_gelu=fuse_bias_gelu, compile=compile)
        _copy(new.fc_in, w_in, b_in)
        _copy(new.fc_out, w_out, b_out)
        record_linear(new, "fc_in", module, "c_fc")
        record_linear(new, "fc_out", module, "c_proj")
        return _finish(new, w_in, module)
    raise OpError(f"no slapo MLP builder for {type(module).__name__}", call="mlp_from_hf",
                  module=module,
                  hint="supported: GPT2MLP, GPTNeoMLP, LlamaMLP, BertIntermediate; build "
                  "MLP(...) by hand otherwise")
