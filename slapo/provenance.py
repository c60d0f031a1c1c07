"""Parameter provenance: where the parameters of a replacement module came from.

A replacement often renames or re-lays parameters: the op library's attention turns HF's
``query``/``key``/``value`` into ``q_proj``/``k_proj``/``v_proj`` or one fused ``qkv_proj``
(grouped per kv head), GPT-2's Conv1D ``c_attn`` (``[in, 3H]``) into a transposed, re-laid
``qkv_proj``, GPT-2's MLP ``c_fc``/``c_proj`` into ``fc_in``/``fc_out``. A *provenance record*
on the new module says, for each original parameter (its name relative to the replaced module),
which new parameters hold it and how to get it back::

    from functools import partial
    from slapo.provenance import chunk, record_provenance

    new = MyFusedQKV(...)                           # new.qkv.weight = cat([q.w, k.w, v.w])
    for i, name in enumerate(("query", "key", "value")):
        record_provenance(new, f"{name}.weight", "qkv.weight", partial(chunk, parts=3, index=i))
    sch["encoder.layer.0.attention.self"].replace(new)

``to_original(*new_tensors)`` receives the *full* (unsharded) tensors of the named new
parameters, in the order given, and returns the original parameter's tensor. It must be a pure
re-layout (slicing, concatenation, transposition, reshapes: linear and elementwise-exact),
because ``slapo.verify`` applies it to both values and gradients. Use module-level functions or
``functools.partial`` of them, so the record survives ``copy.deepcopy`` and pickling.

Names are relative to the module carrying the record, and the original names to the module it
replaced -- the same path, since ``replace`` keeps the path. :func:`derived_parameters` resolves
every record of a model into full names; ``slapo.verify`` compares the original parameters it
finds there (values before the run, gradients, parameters after steps) instead of listing them
as unmatched. The builders of the op library (``attention_from_hf``, ``mlp_from_hf``) record
their mappings.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Sequence, Tuple, Union

import torch
from torch import nn

from .errors import PrimitiveError

__all__ = ["Source", "record_provenance", "provenance_of", "derived_parameters", "same",
           "transposed", "concat", "chunk"]

ATTR = "_slapo_provenance"


@dataclasses.dataclass(frozen=True)
class Source:
    """An original parameter rebuilt from new ones: ``to_original(*full(params))``."""

    params: Tuple[str, ...]
    to_original: Callable[..., torch.Tensor]

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.to_original(*tensors)


def same(t: torch.Tensor) -> torch.Tensor:
    """A renamed parameter: unchanged."""
    return t


def transposed(t: torch.Tensor) -> torch.Tensor:
    """``t.t()``: e.g. a HF ``Conv1D`` weight ``[in, out]`` from a Linear ``[out, in]``."""
    return t.t()


def concat(*tensors: torch.Tensor, dim: int = 0, transpose: bool = False) -> torch.Tensor:
    """``torch.cat(tensors, dim)``, transposed after with ``transpose`` (GPT-2's ``c_attn``
    weight from separate q/k/v Linear weights)."""
    out = torch.cat(tensors, dim=dim)
    return out.t() if transpose else out


def chunk(t: torch.Tensor, parts: int, index: int, dim: int = 0) -> torch.Tensor:
    """Chunk ``index`` of ``parts`` equal chunks of ``t`` along ``dim``."""
    return t.chunk(parts, dim=dim)[index]


def record_provenance(module: nn.Module, original: str, params: Union[str, Sequence[str]],
                      to_original: Callable[..., torch.Tensor] = same) -> None:
    """Record that original parameter ``original`` (relative to the module ``module`` replaces)
    is ``to_original(*params)`` of ``module``'s parameters ``params`` (relative names).

    Raises:
        PrimitiveError: a name in ``params`` is not a parameter of ``module``.
    """
    params = (params,) if isinstance(params, str) else tuple(params)
    names = {n for n, _ in module.named_parameters()}
    missing = [p for p in params if p not in names]
    if missing:
        verb = "is not a parameter" if len(missing) == 1 else "are not parameters"
        shown = params[0] if len(params) == 1 else list(params)
        raise PrimitiveError(f"{', '.join(repr(m) for m in missing)} {verb} of the module",
                             call=f"record_provenance({original!r}, {shown!r})", module=module,
                             hint=f"parameters: {', '.join(sorted(names)) or 'none'}")
    records = module.__dict__.setdefault(ATTR, {})
    records[original] = Source(params, to_original)


def provenance_of(module: nn.Module) -> Dict[str, Source]:
    """The records of ``module`` itself (not its children): ``{original name: Source}``."""
    return dict(module.__dict__.get(ATTR, {}))


def derived_parameters(model: nn.Module) -> Dict[str, Source]:
    """Every record in ``model``, with full names: ``{original parameter path: Source whose
    params are parameter paths of model}``. Records whose new parameters are gone (replaced
    again since) are skipped."""
    present = {n for n, _ in model.named_parameters()}
    out: Dict[str, Source] = {}
    for path, mod in model.named_modules():
        for original, src in provenance_of(mod).items():
            params = tuple(f"{path}.{p}" if path else p for p in src.params)
            if all(p in present for p in params):
                out[f"{path}.{original}" if path else original] = Source(params,
                                                                         src.to_original)
    return out
