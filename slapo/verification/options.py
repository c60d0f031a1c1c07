"""How :func:`slapo.verify` compares: one frozen options object instead of a long argument list.

``slapo.verify(sch, inputs, options=VerifyOptions(dtype=torch.float64, steps=3))`` and
``slapo.verify(sch, inputs, dtype=torch.float64, steps=3)`` are the same call: every field is
also a keyword argument of ``verify`` and ``Verify``, with the same name and default. An options
object can be kept and reused (e.g. one for a whole test suite); ``dataclasses.replace(options,
steps=3)`` derives another. Unknown keywords, and keywords that contradict ``options=``, are
errors rather than silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Dict, Optional, Sequence

import torch

from ..errors import VerifyError
from ..weights.delayed_init import InitFn

__all__ = ["VerifyOptions", "make_options", "check_keywords"]


@dataclasses.dataclass(frozen=True)
class VerifyOptions:
    """What :func:`slapo.verify` compares, in which precision, and what it does on a mismatch.

    Each field is also a keyword argument of ``verify`` and ``Verify`` (same name, same default).
    """

    check_grads: bool = True
    """Also compare the gradient of every original parameter (default ``True``), including those
    the schedule renamed or re-laid (a fused ``qkv_proj``, GPT-2's ``c_attn`` ...), rebuilt in
    the original layout from the provenance records of the replacement modules
    (:mod:`slapo.provenance`); originals with neither a same-named parameter nor a record are
    listed in ``report.unmatched``."""

    dtype: Optional[torch.dtype] = None
    """Run both models in this dtype (default ``None``: as they are); ``torch.float64`` removes
    float noise, so a mismatch there is a real bug."""

    rtol: Optional[float] = None
    """Relative tolerance (default ``None``: by dtype,
    :func:`slapo.verification.tools.default_tolerances`)."""

    atol: Optional[float] = None
    """Absolute tolerance (default ``None``: by dtype, as ``rtol``)."""

    steps: int = 1
    """With ``steps > 1`` (default 1), take that many SGD(``lr``) steps and compare the
    parameters after them too."""

    lr: float = 0.1
    """Learning rate of those SGD steps (default 0.1)."""

    eval_mode: bool = True
    """Run in eval mode, without dropout (default ``True``); in train mode, dropout masks must
    match, which holds only outside ``fork_rng`` regions."""

    seed: int = 2023
    """The RNG seed both models run each step from (default 2023; step ``i`` uses
    ``seed + i``)."""

    localize: bool = True
    """Record module outputs (and output gradients) to name the first diverging module on a
    mismatch (default ``True``)."""

    rules: bool = True
    """First check the schedule's rules (``check_schedule``); any problem fails the verification
    without running the model (default ``True``)."""

    load_weights: bool = True
    """Load the original's weights (broadcast from the group's first rank) into the scheduled
    parameters of the same name, each rank taking its shard, so that both models start from
    identical weights even if the ranks initialised differently (default ``True``). Parameters
    without a same-named original (e.g. a fused q/k/v) keep their values; those with a
    provenance record have them compared with the original's instead."""

    init_weights: InitFn = True
    """For a model built under ``init_empty_weights()`` (meta tensors): how the reference copy
    and the scheduled module are materialised, as ``slapo.build(sch, init_weights=...)`` would
    (default ``True``: the modules' own initialisers; the same deterministic per-module values,
    this rank's shards only); the scheduled module's meta tensors are put back afterwards."""

    init_seed: int = 0
    """Seed of that materialisation, as ``slapo.build(sch, init_seed=...)`` (default 0)."""

    device: Any = None
    """Where a meta model's weights are materialised (default ``None``: the inputs' device).
    Nothing is moved: a real weight or an input on another device is an error (the original
    Slapo's ``Verify(..., device="cuda")`` moved the model there)."""

    check_memory: bool = True
    """Before running, estimate verify's peak memory per rank (:mod:`slapo.verification.budget`)
    and stop with a one-line :class:`~slapo.VerifyError` saying how much is needed and which
    options lower it when that exceeds the memory available (default ``True``)."""

    raise_on_mismatch: bool = True
    """Raise :class:`~slapo.VerifyError` on a mismatch (default ``True``); ``False`` only
    returns the report."""


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(VerifyOptions))


def check_keywords(given: Sequence[str], known: Sequence[str], call: str,
                   fallback_hint: Optional[str] = None) -> None:
    """Raise :class:`VerifyError` for keywords of ``given`` not in ``known``, with the closest
    valid name as the hint (else ``fallback_hint``, else the valid names)."""
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], known, n=1)
    raise VerifyError(f"unknown argument(s) {', '.join(unknown)}", call=call,
                      hint=f"did you mean {close[0]}=?" if close else fallback_hint
                      or f"the keyword arguments of {call}: {', '.join(known)}")


def make_options(options: Optional[VerifyOptions], keywords: Dict[str, Any],
                 call: str) -> VerifyOptions:
    """The options of one call: ``options`` (default :class:`VerifyOptions`) with the keyword
    arguments given, which must be fields and must not contradict ``options``.

    Raises:
        VerifyError: ``options`` is not a ``VerifyOptions``, or a keyword given with
            ``options=`` has another value than it.
    """
    if options is None:
        return VerifyOptions(**keywords)
    if not isinstance(options, VerifyOptions):
        raise VerifyError(f"options must be a slapo.VerifyOptions, got {options!r}", call=call,
                          hint="options=slapo.VerifyOptions(dtype=torch.float64, ...), or pass "
                          "the options as keyword arguments")
    conflicts = [k for k, v in keywords.items() if not _same(v, getattr(options, k))]
    if conflicts:
        given = ", ".join(f"{k}={keywords[k]!r}" for k in conflicts)
        held = ", ".join(f"options.{k}={getattr(options, k)!r}" for k in conflicts)
        raise VerifyError(f"keyword argument(s) {given} contradict options= ({held})", call=call,
                          hint="give each option once: options=dataclasses.replace(options, "
                          f"{conflicts[0]}=...), or only keyword arguments")
    return options


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values without a plain ==, e.g. tensors: not the same
        return False
