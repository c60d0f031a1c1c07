"""Errors raised for user mistakes.

Every user-facing error is a :class:`SlapoError` subclass whose message follows one template::

    shard('weight', axis=0) on 'lm_head' (Linear 768->50257): 50257 is not divisible by the
    tensor-parallel size 8. Hint: pad vocab_size to a multiple of 8.

i.e. *what was called*, *where* (module path and a short description of the module), *what is
wrong*, and *how to fix it*. ``assert`` is reserved for internal invariants of slapo itself.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Dict, Optional

from torch import nn

__all__ = [
    "SlapoError",
    "PathError",
    "PrimitiveError",
    "RegistryError",
    "ReplaceError",
    "CheckpointError",
    "AnnotateError",
    "ShardError",
    "SyncError",
    "TraceError",
    "PatternError",
    "PipelineError",
    "BuildError",
    "InitError",
    "CheckpointIOError",
    "VerifyError",
    "ConfigError",
    "OpError",
    "TuneError",
    "PortingError",
    "PortingImportError",
    "original_name",
    "register_original_names",
    "describe_module",
]


def describe_module(mod: Optional[nn.Module]) -> str:
    """A short, human readable description of a module, e.g. ``Linear 768->3072``."""
    if mod is None:
        return "?"
    name = type(mod).__name__
    if isinstance(mod, nn.Linear):
        return f"{name} {mod.in_features}->{mod.out_features}"
    if isinstance(mod, nn.Embedding):
        return f"{name} {mod.num_embeddings}x{mod.embedding_dim}"
    if isinstance(mod, nn.Conv2d):
        return f"{name} {mod.in_channels}->{mod.out_channels}"
    weight = getattr(mod, "weight", None)
    if name == "Conv1D" and weight is not None:  # transformers.pytorch_utils.Conv1D: [in, out]
        return f"{name} {weight.shape[0]}->{weight.shape[1]}"
    return name


class SlapoError(Exception):
    """Base class of every error caused by a wrong schedule, model or configuration.

    Args:
        what: what is wrong, as a sentence fragment.
        path: the module path the error is about ("" is the root), if any.
        call: the primitive call, e.g. ``"shard('weight', axis=0)"``.
        module: the module at ``path``, used to describe it.
        hint: how to fix it.
    """

    def __init__(
        self,
        what: str,
        *,
        path: Optional[str] = None,
        call: Optional[str] = None,
        module: Optional[nn.Module] = None,
        hint: Optional[str] = None,
    ):
        self.what = what
        self.path = path
        self.call = call
        self.hint = hint
        self.module_desc = describe_module(module) if module is not None else None
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.call:
            where.append(self.call)
        if self.path is not None:
            path = self.path or "<root>"
            where.append(f"on '{path}'" if self.call else f"'{path}'")
        if self.module_desc:
            where.append(f"({self.module_desc})")
        msg = (" ".join(where) + ": " if where else "") + _sentence(self.what)
        if self.hint:
            msg += f" Hint: {_sentence(self.hint)}"
        return msg


def _sentence(text: str) -> str:
    text = text.rstrip()
    return text if text.endswith((".", "?", "!")) else text + "."


class PathError(SlapoError, LookupError):
    """A module path does not exist in the schedule."""


class PrimitiveError(SlapoError):
    """A primitive was called with invalid arguments or in an invalid state."""


class RegistryError(SlapoError):
    """Registering or looking up a primitive / dialect / model schedule failed."""


class ReplaceError(PrimitiveError):
    """``replace`` / ``replace_all`` preconditions violated."""


class CheckpointError(PrimitiveError):
    """``checkpoint`` preconditions violated."""


class AnnotateError(PrimitiveError):
    """``annotate`` preconditions violated."""


class ShardError(PrimitiveError):
    """``shard`` preconditions violated (unknown name, indivisible size, double sharding ...)."""


class SyncError(PrimitiveError):
    """``sync`` preconditions or layout rules violated."""


class TraceError(PrimitiveError):
    """A module could not be traced; names the construct that failed."""


class PatternError(PrimitiveError):
    """``find`` got an invalid pattern or found nothing where something was required."""


class PipelineError(PrimitiveError):
    """Pipeline cut / partition preconditions violated."""


class BuildError(SlapoError):
    """``build`` could not produce a runnable model (unknown target, missing framework ...)."""


class InitError(SlapoError):
    """Delayed (meta-device) initialisation failed."""


class CheckpointIOError(SlapoError):
    """Saving / loading / resharding a checkpoint failed."""


class VerifyError(SlapoError, AssertionError):
    """Numerical verification found a mismatch between the original and the scheduled model."""


class ConfigError(SlapoError, ValueError):
    """An invalid configuration value (knobs, benchmark configs ...)."""


class OpError(SlapoError, ValueError):
    """An op of :mod:`slapo.op` was built or called with invalid arguments (head counts that do
    not divide, an attention kernel that cannot run on this device or with these inputs ...)."""


class TuneError(SlapoError, ValueError):
    """An auto-tuning search space, objective or study is invalid (``slapo.autotune``)."""


class PortingError(SlapoError, AttributeError):
    """A name of the original Slapo that is spelled differently here (``slapo.random``,
    ``slapo.op.FusedMLP``, ``sch.find_node`` ...); the hint names ours. An ``AttributeError``,
    so ``hasattr`` and ``getattr(..., default)`` keep working. See ``docs/porting.md``."""


def original_name(owner: str, name: str, table: Dict[str, str]) -> AttributeError:
    """The error for attribute ``name`` missing from ``owner`` (a module or class name): a
    :class:`PortingError` with ``table[name]`` as the hint when the original Slapo had that
    name, else a plain ``AttributeError``. For module and class ``__getattr__`` hooks."""
    if name in table:
        return PortingError(f"'{owner}.{name}' is the original Slapo's name; it is spelled "
                            "differently here", call=f"{owner}.{name}", hint=table[name])
    return AttributeError(f"'{owner}' has no attribute '{name}'")


class PortingImportError(SlapoError, ImportError):
    """``import slapo.random`` / ``from slapo import get_cuda_rng_tracker``: an import of a name
    of the original Slapo that is spelled differently here; the hint names ours."""


class _OriginalNames(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: asked only for modules no other finder knows, it raises
    :class:`PortingImportError` for the original's names, so the import statement shows the
    hint (``from pkg import name`` tries ``pkg.name`` as a module after the attribute)."""

    def __init__(self) -> None:
        self.names: Dict[str, str] = {}

    def find_spec(self, fullname, path=None, target=None):
        hint = self.names.get(fullname)
        if hint is not None:
            raise PortingImportError(f"'{fullname}' is the original Slapo's name; it is spelled "
                                     "differently here", call=f"import {fullname}", hint=hint)
        return None


_FINDER = _OriginalNames()


def register_original_names(owner: str, table: Dict[str, str]) -> None:
    """Make ``import owner.name`` and ``from owner import name`` raise
    :class:`PortingImportError` with ``table[name]`` as the hint (pair with a module
    ``__getattr__`` raising :func:`original_name`)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
    _FINDER.names.update({f"{owner}.{name}": hint for name, hint in table.items()})
