"""Registry of runtime dialects used by :func:`slapo.build`."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Type

from torch import nn

from ..errors import BuildError, RegistryError

__all__ = ["Dialect", "register_dialect", "get_dialect", "list_dialects"]

_DIALECTS: Dict[str, Type["Dialect"]] = {}


class Dialect:
    """A build target. ``build`` receives the schedule and the ready model and returns
    ``(model_or_engine, optimizer_or_None)``; ``options`` lists the keyword arguments it takes."""

    name: str = ""
    options: Tuple[str, ...] = ()

    def build(self, sch, model: nn.Module, **kwargs: Any) -> Tuple[Any, Optional[Any]]:
        raise NotImplementedError  # pragma: no cover - interface


def register_dialect(cls: Type[Dialect]) -> Type[Dialect]:
    """Class decorator registering a dialect under ``cls.name``."""
    if not cls.name:
        raise RegistryError(f"dialect {cls.__name__} has no name", hint="set `name` on the class")
    if cls.name in _DIALECTS and _DIALECTS[cls.name] is not cls:
        raise RegistryError(f"a dialect named '{cls.name}' is already registered",
                            hint="choose another name")
    _DIALECTS[cls.name] = cls
    return cls


def get_dialect(target: Optional[str], path: Optional[str] = None) -> Dialect:
    """An instance of the dialect for ``target`` (``None`` means ``"torch"``); ``path`` is the
    schedule being built, for the error message."""
    key = "torch" if target is None else target
    if key not in _DIALECTS:
        raise BuildError(f"unknown build target {target!r}", call="build", path=path,
                         hint=f"use one of {', '.join(repr(k) for k in sorted(_DIALECTS))}")
    return _DIALECTS[key]()


def list_dialects() -> list:
    """Names of the registered build targets."""
    return sorted(_DIALECTS)
