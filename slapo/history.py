"""The record of every primitive call on a schedule: printable as code, replayable on a new model.

``print(sch.history)`` renders runnable schedule code::

    # slapo schedule: 2 primitive calls
    # objects = sch.history.objects  (values without a source form, by index)
    import torch.nn
    sch['encoder.layer.0.attention'].replace(objects[0])  # SelfAttention
    sch['encoder.layer.1'].checkpoint()

and ``sch.history.replay(fresh_model)`` applies the same calls to a new instance of the model and
returns its schedule. Module arguments are snapshotted (deep-copied) when a primitive is called,
so a replay gets modules with the weights they had at that moment, independent of what later
primitives did to the originals.

Values that cannot be written as source are kept in ``history.objects``. An argument may also
describe itself for the history by defining ``__slapo_record__()``, returning a
:class:`Deferred` (used e.g. for subgraphs found by ``find``, which must be found again on a
replayed model).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

__all__ = ["History", "HistoryEntry", "Deferred"]


@dataclasses.dataclass(frozen=True)
class Deferred:
    """An argument that is recomputed on replay: ``resolve(root_schedule)`` gives the value and
    ``source`` is how it is written in the rendered code (may use the name ``sch``)."""

    source: str
    resolve: Callable[[Any], Any]


@dataclasses.dataclass
class HistoryEntry:
    """One primitive call: ``sch[path].primitive(*args, **kwargs)``."""

    path: str
    primitive: str
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]


def _contains_module(value: Any) -> bool:
    if isinstance(value, nn.Module):
        return True
    if isinstance(value, (list, tuple)):
        return any(_contains_module(v) for v in value)
    if isinstance(value, dict):
        return any(_contains_module(v) for v in value.values())
    return False


def _snapshot(value: Any) -> Any:
    if hasattr(value, "__slapo_record__"):
        return value.__slapo_record__()
    if _contains_module(value):
        return copy.deepcopy(value)
    return value


_LITERALS = (type(None), bool, int, float, complex, str, bytes)


class History:
    """Ordered list of :class:`HistoryEntry`, with code rendering and replay."""

    def __init__(self, new_schedule: Callable[..., Any]) -> None:
        """``new_schedule(model, group=...)`` creates the schedule a replay applies the calls to
        (``slapo.create_schedule``; passed in so that this record sits below the schedule)."""
        self.entries: List[HistoryEntry] = []
        self._new_schedule = new_schedule

    # ------------------------------------------------------------------ recording
    def prepare(self, path: str, primitive: str, args: tuple, kwargs: dict) -> HistoryEntry:
        """Snapshot a call's arguments before the primitive runs (it may mutate them)."""
        return HistoryEntry(
            path,
            primitive,
            tuple(_snapshot(a) for a in args),
            {k: _snapshot(v) for k, v in kwargs.items()},
        )

    def commit(self, entry: HistoryEntry) -> None:
        """Record a call that succeeded."""
        self.entries.append(entry)

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def __getitem__(self, i: int) -> HistoryEntry:
        return self.entries[i]

    # ------------------------------------------------------------------ rendering
    @property
    def objects(self) -> List[Any]:
        """Argument values without a source form, in the order the rendered code indexes them."""
        return self._render()[1]

    def to_code(self) -> str:
        """Schedule code that re-applies every call to a schedule named ``sch``."""
        return self._render()[0]

    def __str__(self) -> str:
        return self.to_code()

    def __repr__(self) -> str:
        return f"<History of {_calls(len(self.entries))}>"

    def _render(self) -> Tuple[str, List[Any]]:
        objects: List[Any] = []
        imports: set = set()

        def src(value: Any) -> str:
            if isinstance(value, Deferred):
                return value.source
            if isinstance(value, enum.Enum):
                imports.add(type(value).__module__)
                return f"{type(value).__module__}.{type(value).__qualname__}.{value.name}"
            if isinstance(value, _LITERALS):
                if isinstance(value, float) and value != value:  # nan
                    return "float('nan')"
                return repr(value)
            if isinstance(value, torch.dtype):
                return str(value)  # e.g. torch.float16
            if isinstance(value, torch.Size):
                return f"torch.Size({list(value)!r})"
            if isinstance(value, list):
                return "[" + ", ".join(src(v) for v in value) + "]"
            if isinstance(value, tuple):
                inner = ", ".join(src(v) for v in value)
                return f"({inner},)" if len(value) == 1 else f"({inner})"
            if isinstance(value, dict) and all(isinstance(k, str) for k in value):
                return "{" + ", ".join(f"{k!r}: {src(v)}" for k, v in value.items()) + "}"
            if (inspect.isclass(value) or inspect.isfunction(value) or inspect.isbuiltin(value)):
                module = getattr(value, "__module__", None)
                qual = getattr(value, "__qualname__", "")
                if module and module != "__main__" and "<" not in qual:
                    imports.add(module)
                    return f"{module}.{qual}"
            objects.append(value)
            return f"objects[{len(objects) - 1}]"

        lines = []
        for e in self.entries:
            call_args = [src(a) for a in e.args] + [f"{k}={src(v)}" for k, v in e.kwargs.items()]
            target = f"sch[{e.path!r}]" if e.path else "sch"
            line = f"{target}.{e.primitive}({', '.join(call_args)})"
            mods = [type(a).__name__ for a in e.args if isinstance(a, nn.Module)]
            if mods:
                line += "  # " + ", ".join(mods)
            lines.append(line)
        header = [f"# slapo schedule: {_calls(len(self.entries))}"]
        if objects:
            header.append(
                "# objects = sch.history.objects  (values without a source form, by index)"
            )
        header += [f"import {m}" for m in sorted(imports | {"torch"})]
        return "\n".join(header + lines) + "\n", objects

    # ------------------------------------------------------------------ replay
    def replay(self, model: nn.Module, group: Optional[Any] = None):
        """Apply every recorded call to ``model`` (a fresh instance) and return its schedule.

        Module arguments are deep-copied again, so one history can be replayed many times.
        """
        sch = self._new_schedule(model, group=group)

        def resolve(value: Any) -> Any:
            if isinstance(value, Deferred):
                return value.resolve(sch)
            return copy.deepcopy(value) if _contains_module(value) else value

        for e in self.entries:
            args = tuple(resolve(a) for a in e.args)
            kwargs = {k: resolve(v) for k, v in e.kwargs.items()}
            getattr(sch[e.path], e.primitive)(*args, **kwargs)
        return sch


def _calls(n: int) -> str:
    return f"{n} primitive call" + ("" if n == 1 else "s")
