"""Shared validation helpers for primitives (messages follow the SlapoError template)."""

from __future__ import annotations

import difflib
import inspect
from typing import Iterable, List, Optional

from torch import nn

from ..runtime.forward_wrap import base_forward

__all__ = ["closest", "forward_signature", "signature_mismatch", "format_call"]


def closest(name: str, candidates: Iterable[str]) -> str:
    """A hint naming the closest candidates to ``name``."""
    candidates = list(candidates)
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.4)
    if close:
        return "did you mean " + ", ".join(f"'{c}'" for c in close) + "?"
    if candidates:
        shown = ", ".join(f"'{c}'" for c in candidates[:8])
        return f"available: {shown}" + (" ..." if len(candidates) > 8 else "")
    return "the module has none"


def format_call(name: str, *args, **kwargs) -> str:
    """``name(arg, k=v)`` with short reprs, for error messages."""

    def short(v) -> str:
        if isinstance(v, nn.Module):
            return type(v).__name__ + "(...)"
        if callable(v) and hasattr(v, "__name__"):
            return v.__name__
        text = repr(v)
        return text if len(text) <= 40 else text[:37] + "..."

    parts = [short(a) for a in args] + [f"{k}={short(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def forward_signature(mod: nn.Module) -> Optional[inspect.Signature]:
    """The signature of ``mod``'s forward (without ``self``), or None if unavailable."""
    try:
        return inspect.signature(base_forward(mod))
    except (TypeError, ValueError):
        return None


def signature_mismatch(old: nn.Module, new: nn.Module) -> List[str]:
    """Reasons why calls that work on ``old`` would fail on ``new`` (empty when compatible).

    A caller may pass ``old``'s required positional arguments positionally and any of its named
    parameters by keyword; ``new`` must accept both and must not require anything else.
    """
    old_sig, new_sig = forward_signature(old), forward_signature(new)
    if old_sig is None or new_sig is None:
        return []
    P = inspect.Parameter
    old_params = list(old_sig.parameters.values())
    new_params = list(new_sig.parameters.values())
    new_var_pos = any(p.kind is P.VAR_POSITIONAL for p in new_params)
    new_var_kw = any(p.kind is P.VAR_KEYWORD for p in new_params)
    old_var_kw = any(p.kind is P.VAR_KEYWORD for p in old_params)
    pos_kinds = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)
    old_pos = [p for p in old_params if p.kind in pos_kinds]
    new_pos = [p for p in new_params if p.kind in pos_kinds]
    old_required = [p for p in old_pos if p.default is P.empty]
    reasons = []
    if len(new_pos) < len(old_required) and not new_var_pos:
        reasons.append(
            f"the original forward takes {len(old_required)} required positional arguments "
            f"({', '.join(p.name for p in old_required)}) but the new one accepts only "
            f"{len(new_pos)}"
        )
    new_required = [p for p in new_params
                    if p.default is P.empty and p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)]
    old_names = {p.name for p in old_params}
    extra = [p.name for i, p in enumerate(new_required)
             if (p.kind in pos_kinds and i >= len(old_pos))
             or (p.kind is P.KEYWORD_ONLY and p.name not in old_names and not old_var_kw)]
    if extra:
        reasons.append(f"the new forward requires argument(s) the original does not take: "
                       f"{', '.join(extra)}")
    if not new_var_kw:
        new_names = {p.name for p in new_params if p.kind is not P.POSITIONAL_ONLY}
        missing = [p.name for p in old_params
                   if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)
                   and p.default is not P.empty and p.name not in new_names]
        if missing:
            reasons.append(
                "the new forward does not accept argument(s) a caller may pass by name: "
                + ", ".join(missing)
            )
    return reasons
