"""Fused element-wise ops: bias+GeLU and bias+dropout+residual(+LayerNorm).

Each op has an eager reference (``*_reference``, the plain composition tests compare against)
and a fast path that runs the same function through ``torch.compile``, so the compiler can fuse
the element-wise chain into one kernel. Compilation is lazy (on the first call, never at import
or construction) and off by default; ``compile`` selects it:

* ``None`` / ``False``: eager (the reference);
* ``True``: ``torch.compile`` with the default (inductor) backend;
* a string: that ``torch.compile`` backend (tests use ``"aot_eager"``: inductor costs ~19 s
  cold on the development CPUs and gave no speedup there).

When already inside a compiled region (compiling the whole model) the eager function is used and
the outer compiler fuses it. Dropout is applied only when ``training`` is true (modules pass
their ``self.training``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import OpError

__all__ = [
    "Compile", "GELU_APPROXIMATIONS", "bias_gelu_reference", "bias_gelu",
    "bias_dropout_residual_reference", "bias_dropout_residual",
    "bias_dropout_residual_layer_norm_reference", "bias_dropout_residual_layer_norm",
    "FusedBiasGeLU", "FusedBiasDropoutResidual", "LinearBiasGeLU", "LazyCompiled",
]

Compile = Union[None, bool, str]
GELU_APPROXIMATIONS = ("none", "tanh")


def _check_approximate(approximate: str, call: str) -> str:
    if approximate not in GELU_APPROXIMATIONS:
        raise OpError(f"unknown GeLU approximation {approximate!r}", call=call,
                      hint="use 'none' (exact erf GeLU) or 'tanh' (GPT-2's gelu_new)")
    return approximate


def _check_p(p: float, call: str) -> float:
    if not 0.0 <= p <= 1.0:
        raise OpError(f"dropout probability {p} is outside [0, 1]", call=call)
    return float(p)


# ---------------------------------------------------------------------- references
def bias_gelu_reference(x: torch.Tensor, bias: torch.Tensor,
                        approximate: str = "none") -> torch.Tensor:
    """``gelu(x + bias)``; ``approximate="tanh"`` is the tanh approximation (``gelu_new``)."""
    return F.gelu(x + bias, approximate=approximate)


def bias_dropout_residual_reference(x: torch.Tensor, bias: Optional[torch.Tensor],
                                    residual: Optional[torch.Tensor], p: float,
                                    training: bool) -> torch.Tensor:
    """``residual + dropout(x + bias)`` (either of ``bias``/``residual`` may be ``None``)."""
    y = x if bias is None else x + bias
    y = F.dropout(y, p=p, training=training)
    return y if residual is None else residual + y


def bias_dropout_residual_layer_norm_reference(
    x: torch.Tensor, bias: Optional[torch.Tensor], residual: torch.Tensor, p: float,
    training: bool, ln_weight: Optional[torch.Tensor], ln_bias: Optional[torch.Tensor],
    eps: float = 1e-5,
) -> torch.Tensor:
    """``layer_norm(residual + dropout(x + bias))`` over the last dimension (BERT's
    ``SelfOutput``/``Output`` and ALBERT's attention epilogue)."""
    y = bias_dropout_residual_reference(x, bias, residual, p, training)
    return F.layer_norm(y, y.shape[-1:], ln_weight, ln_bias, eps)


# ---------------------------------------------------------------------- compiled paths
class LazyCompiled:
    """``fn`` compiled with ``torch.compile(backend=...)`` on its first call.

    Copies (``copy.deepcopy`` of a module that holds one, as schedule history replay does) and
    pickles start uncompiled again.
    """

    def __init__(self, fn: Callable, backend: str):
        self.fn, self.backend = fn, backend
        self._compiled: Optional[Callable] = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return self.fn(*args, **kwargs)
        if self._compiled is None:
            self._compiled = torch.compile(self.fn, backend=self.backend)
        return self._compiled(*args, **kwargs)

    def __deepcopy__(self, memo: dict) -> "LazyCompiled":
        return LazyCompiled(self.fn, self.backend)

    def __getstate__(self) -> dict:
        return {"fn": self.fn, "backend": self.backend, "_compiled": None}

    def __repr__(self) -> str:
        return f"LazyCompiled({self.fn.__name__}, backend={self.backend!r})"


_CACHE: Dict[Tuple[Callable, str], LazyCompiled] = {}


def _runner(fn: Callable, compile: Compile) -> Callable:
    """``fn`` itself, or a shared lazily compiled version of it."""
    if compile is None or compile is False:
        return fn
    backend = "inductor" if compile is True else compile
    if not isinstance(backend, str):
        raise OpError(f"compile={compile!r} is not a bool or a torch.compile backend name",
                      call=fn.__name__, hint="pass False, True or e.g. 'aot_eager'")
    key = (fn, backend)
    if key not in _CACHE:
        _CACHE[key] = LazyCompiled(fn, backend)
    return _CACHE[key]


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none", *,
              compile: Compile = None) -> torch.Tensor:
    """Fused ``gelu(x + bias)`` (see :func:`bias_gelu_reference`)."""
    _check_approximate(approximate, "bias_gelu")
    return _runner(bias_gelu_reference, compile)(x, bias, approximate)


def bias_dropout_residual(x: torch.Tensor, bias: Optional[torch.Tensor],
                          residual: Optional[torch.Tensor], p: float, training: bool, *,
                          compile: Compile = None) -> torch.Tensor:
    """Fused ``residual + dropout(x + bias)`` (see :func:`bias_dropout_residual_reference`)."""
    p = _check_p(p, "bias_dropout_residual")
    return _runner(bias_dropout_residual_reference, compile)(x, bias, residual, p, training)


def bias_dropout_residual_layer_norm(
    x: torch.Tensor, bias: Optional[torch.Tensor], residual: torch.Tensor, p: float,
    training: bool, ln_weight: Optional[torch.Tensor], ln_bias: Optional[torch.Tensor],
    eps: float = 1e-5, *, compile: Compile = None,
) -> torch.Tensor:
    """Fused ``layer_norm(residual + dropout(x + bias))``."""
    p = _check_p(p, "bias_dropout_residual_layer_norm")
    return _runner(bias_dropout_residual_layer_norm_reference, compile)(
        x, bias, residual, p, training, ln_weight, ln_bias, eps)


# ---------------------------------------------------------------------- modules
class FusedBiasGeLU(nn.Module):
    """``forward(x, bias) = gelu(x + bias)``, eager or compiled."""

    def __init__(self, approximate: str = "none", compile: Compile = None):
        super().__init__()
        self.approximate = _check_approximate(approximate, "FusedBiasGeLU")
        self.compile = compile

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return bias_gelu(x, bias, self.approximate, compile=self.compile)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}, compile={self.compile!r}"


class FusedBiasDropoutResidual(nn.Module):
    """``forward(x, bias, residual) = residual + dropout(x + bias)``, followed by a LayerNorm
    (owned here as ``layer_norm``) when ``normalized_shape`` is given. Dropout only in training.
    """

    def __init__(self, p: float = 0.0, normalized_shape: Optional[int] = None,
                 eps: float = 1e-5, compile: Compile = None):
        super().__init__()
        self.p = _check_p(p, "FusedBiasDropoutResidual")
        self.compile = compile
        self.layer_norm = (nn.LayerNorm(normalized_shape, eps=eps)
                           if normalized_shape is not None else None)

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor],
                residual: Optional[torch.Tensor]) -> torch.Tensor:
        if self.layer_norm is None:
            return bias_dropout_residual(x, bias, residual, self.p, self.training,
                                         compile=self.compile)
        if residual is None:
            raise OpError("the LayerNorm variant needs a residual", call="FusedBiasDropoutResidual",
                          hint="pass the block input as residual, or build without a LayerNorm")
        ln = self.layer_norm
        return bias_dropout_residual_layer_norm(x, bias, residual, self.p, self.training,
                                                ln.weight, ln.bias, ln.eps, compile=self.compile)

    def extra_repr(self) -> str:
        return f"p={self.p}, compile={self.compile!r}"


class LinearBiasGeLU(nn.Linear):
    """``gelu(x @ W.T + b)`` with the bias add fused into the GeLU.

    Still an ``nn.Linear`` (``weight [out, in]``, ``bias [out]``), so column-parallel sharding
    (weight and bias on axis 0) and hooks on the module work unchanged: the module itself is
    called, only its body differs.
    """

    def __init__(self, in_features: int, out_features: int, approximate: str = "none",
                 compile: Compile = None, device: Any = None, dtype: Any = None):
        super().__init__(in_features, out_features, bias=True, device=device, dtype=dtype)
        self.approximate = _check_approximate(approximate, "LinearBiasGeLU")
        self.compile = compile

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bias_gelu(F.linear(x, self.weight), self.bias, self.approximate,
                         compile=self.compile)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", approximate={self.approximate!r}"
