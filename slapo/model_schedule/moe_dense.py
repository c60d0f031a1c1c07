"""Dense-routed experts (Llama 4): every expert runs on its own block of rows of one input.

Llama 4's ``Llama4TextExperts`` is not one of HF's experts-implementation modules (no
``is_transposed``/``has_gate`` flags, no ``top_k_index``): its MoE block scales every token by
each expert's router score (0 for the experts not chosen), stacks the ``E`` copies and calls the
experts with that one tensor, ``x [E * T, H]`` (rows ``e*T .. (e+1)*T`` for expert ``e``); the
experts compute, per expert, ``(act(x_e @ gate_e) * (x_e @ up_e)) @ down_e`` with
``gate_up_proj [E, H, 2I]`` (gate | up along the last axis) and ``down_proj [E, I, H]``, and the
block sums the ``E`` row blocks. Its router is a ``Linear`` (``router``) and a shared expert
runs beside the experts (plain Linears the plan shards like any MLP).

:func:`dense_routed` recognises such a module (one input, no HF experts flags);
:func:`transposed_from_shapes` reads its ``[E, in, out]`` layout from the hidden size (the flag
is missing); :func:`check_dense_form` runs its own ``forward`` on a small probe and compares it
with the formula above (anything else is refused: the split below would be wrong for it);
:func:`shard_dense_experts` shards it in one of two forms:

* tensor parallelism inside every expert: ``gate_up_proj`` sharded on its intermediate axis
  with ``fused=2`` (a slice of the gate block and of the up block), ``down_proj`` on its
  intermediate axis; the output (a partial sum) is all-reduced (``sync("fwd_post",
  "all_reduce")``) and so is the gradient of the input (``sync("bwd_post", "all_reduce")``: it
  carries the router's gradient through the scores);
* expert parallelism: both tensors sharded on the expert axis 0 (``E / n`` whole experts per
  rank); the input's rows are split (``sync("fwd_pre", "scatter", axis=0)``, all-gathered in
  backward) and the output's rows all-gathered (``sync("fwd_post", "all_gather", axis=0)``,
  split in backward). No all-to-all: every expert already sees every token.
"""

from __future__ import annotations

import copy
import inspect
from typing import Optional

import torch
from torch import nn

from ..errors import ConfigError
from ..schedule import Schedule

__all__ = ["dense_routed", "transposed_from_shapes", "check_dense_form", "shard_dense_experts"]

_PROBE_INTERMEDIATE = 2
_PROBE_TOKENS = 3


def dense_routed(mod: nn.Module) -> bool:
    """Whether ``mod`` is called as dense-routed experts: not an HF experts-implementation
    module (no ``is_transposed`` flag) and a ``forward`` taking one input."""
    if hasattr(mod, "is_transposed"):
        return False
    try:
        params = list(inspect.signature(inspect.unwrap(type(mod).forward)).parameters.values())
    except (TypeError, ValueError):
        return False
    return len(params) == 2 and params[1].kind in (params[1].POSITIONAL_ONLY,
                                                   params[1].POSITIONAL_OR_KEYWORD)


def _tensor(mod: nn.Module, name: str) -> torch.Tensor:
    value = getattr(mod, name)
    assert isinstance(value, torch.Tensor), name  # checked by moe.ExpertsLayout.of
    return value


def _hidden_size(mod: nn.Module) -> Optional[int]:
    size = getattr(mod, "hidden_size", None) or getattr(getattr(mod, "config", None),
                                                         "hidden_size", None)
    return size if isinstance(size, int) else None


def transposed_from_shapes(mod: nn.Module, up: str) -> Optional[bool]:
    """``True`` for ``[E, in, out]`` tensors (``up [E, H, *]``, ``down_proj [E, *, H]``),
    ``False`` for ``[E, out, in]``, ``None`` when the hidden size is unknown or the shapes fit
    neither (both cannot fit: that would need ``2I == H == I``)."""
    hidden = _hidden_size(mod)
    up_shape, down_shape = _tensor(mod, up).shape, _tensor(mod, "down_proj").shape
    if hidden is None:
        return None
    if up_shape[1] == hidden and down_shape[2] == hidden:
        return True
    if up_shape[2] == hidden and down_shape[1] == hidden:
        return False
    return None


def _probe_error(path: str, mod: nn.Module, why: str) -> ConfigError:
    return ConfigError(f"{type(mod).__name__} is called with one input but {why}", path=path,
                       call="shard_experts", module=mod,
                       hint="only experts computing act(x_e @ gate_e) * (x_e @ up_e) @ down_e "
                       "per row block (Llama 4's) are sharded; schedule this module by hand")


def check_dense_form(path: str, mod: nn.Module, transposed: bool) -> None:
    """Run ``mod``'s own ``forward`` on a probe (random ``[E, H, 2k]``/``[E, k, H]`` tensors,
    ``k`` small, in place of its weights; ``E * 3`` rows) and compare it with the formula of
    the module docs. Changes nothing (the probe is a shallow copy).

    Raises:
        ConfigError: no ``gate_up_proj``/``act_fn``, or another result.
    """
    act = getattr(mod, "act_fn", None)
    if getattr(mod, "gate_up_proj", None) is None or not callable(act):
        raise _probe_error(path, mod, "has no gate_up_proj and act_fn to check its form by")
    num = int(_tensor(mod, "gate_up_proj").shape[0])
    hidden = int(_tensor(mod, "down_proj").shape[2 if transposed else 1])
    gen = torch.Generator().manual_seed(0)
    k = _PROBE_INTERMEDIATE
    gate_up = torch.randn(num, hidden, 2 * k, generator=gen)
    down = torch.randn(num, k, hidden, generator=gen)
    x = torch.randn(num * _PROBE_TOKENS, hidden, generator=gen)
    gate, up = torch.bmm(x.view(num, -1, hidden), gate_up).chunk(2, dim=-1)
    want = torch.bmm(act(gate) * up, down).reshape(-1, hidden)
    probe = copy.copy(mod)
    probe._parameters = dict(mod._parameters)
    probe._parameters["gate_up_proj"] = nn.Parameter(
        gate_up if transposed else gate_up.transpose(1, 2).contiguous())
    probe._parameters["down_proj"] = nn.Parameter(
        down if transposed else down.transpose(1, 2).contiguous())
    try:
        with torch.no_grad():
            got = inspect.unwrap(type(mod).forward)(probe, x)
    except (RuntimeError, TypeError, ValueError, AttributeError) as e:
        raise _probe_error(path, mod, f"its forward fails on a probe ({type(e).__name__}: "
                           f"{str(e).splitlines()[0][:120]})") from None
    if not (isinstance(got, torch.Tensor) and got.shape == want.shape
            and torch.allclose(got, want, rtol=1e-4, atol=1e-5)):
        raise _probe_error(path, mod, "its forward on a probe is not the per-expert gated MLP "
                           "of its row blocks")


def shard_dense_experts(sch: Schedule, path: str, axes: dict, fused: dict, *,
                        expert_parallel: bool) -> None:
    """Shard the dense-routed experts at ``path`` (module docs); ``axes``/``fused`` as in
    ``moe.ExpertsLayout`` (checked before)."""
    node = sch[path]
    if expert_parallel:
        node.shard(list(axes), axis=0)
        node.sync("fwd_pre", "scatter", axis=0)
        node.sync("fwd_post", "all_gather", axis=0)
        return
    for name, axis in axes.items():
        node.shard(name, axis=axis, **({"fused": 2} if fused[name] == 2 else {}))
    node.sync("bwd_post", "all_reduce")
    node.sync("fwd_post", "all_reduce")
