"""Values a trace bakes in besides the mode: dtypes and devices of traced values, flags read
from a HuggingFace config at call time, and module flags such as ``gradient_checkpointing``.

Model code makes Python decisions on such values while it is traced, and the graph keeps the
decision, not the read:

* **dtype / device** of a traced value (``input_dtype = hidden_states.dtype`` then
  ``.to(input_dtype)`` in LLaMA's RMSNorm; ``torch.finfo(x.dtype).min``; ``device=x.device``;
  ``if self.weight.dtype in [torch.float16, torch.bfloat16]`` in T5's layer norm). The tracer
  answers them from the example value, as real ``torch.dtype`` / ``torch.device`` objects
  (``torch.finfo``, ``torch.autocast(device_type=...)``, dict lookups and values crossing a
  pipeline cut need real ones), and adds a :func:`check_tensor_attr` guard per value and
  attribute read: the attribute is read again on every call and a change raises one line.
* **config flags** read at call time (``ALL_ATTENTION_FUNCTIONS.get_interface(
  self.config._attn_implementation)``, ``config.output_attentions`` / ``return_dict`` /
  ``use_cache`` in HF's output decorators). While tracing, every config object held by a module
  of the region (and its sub-configs) records the attributes the model code reads
  (:class:`ConfigReads`: the object's class is swapped for a recording subclass for the
  duration); reads inside leaf modules and value propagation are not recorded, since those run
  again on every call.
* **module flags** the region's code reads (``gradient_checkpointing`` in HF's
  ``GradientCheckpointingLayer.__call__`` and T5's attention), found in the code objects of the
  modules whose code the graph inlines (:func:`module_flags`).

* **HF output capture** (``output_attentions`` / ``output_hidden_states`` passed or set in the
  config of an untraced parent): HF collects those outputs with forward hooks on modules
  chosen by class (``_can_record_outputs``); a module whose code the graph inlined has no call
  for such a hook, so its outputs would silently be missing. The keys whose hooks would sit on
  an inlined module (:func:`capture_keys`) are refused while a capture of them is active.

Config and module flags are checked by one :class:`BakedState` per traced module (a few
attribute reads and comparisons per call): the traced graph either follows them (reads inside
leaves) or refuses with one line naming the module, the value it was traced with and how to
re-trace. ``torch.get_default_dtype()`` is guarded with grad mode and autocast
(:mod:`slapo.trace.guards`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn
from torch.fx.node import has_side_effect

from ..errors import TraceError

__all__ = ["check_tensor_attr", "ConfigReads", "BakedState", "check_baked", "module_flags",
           "GUARDED_TENSOR_ATTRS", "ABSENT"]

# Tensor attributes the tracer answers from example values: each read is guarded.
GUARDED_TENSOR_ATTRS = ("dtype", "device", "ndim", "is_cuda", "is_sparse", "is_quantized",
                        "layout", "is_meta")
# Module attributes that HF toggles after construction and model code reads at call time.
MODULE_FLAGS = ("gradient_checkpointing",)

_LITERALS = (type(None), bool, int, float, str, torch.dtype, torch.device)
_TRACE_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


class _Absent:
    """The value of an attribute that did not exist (``getattr(config, "x", default)``)."""

    def __repr__(self) -> str:
        return "<absent>"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Absent)

    def __hash__(self) -> int:
        return 0

    def __deepcopy__(self, memo: dict) -> "_Absent":
        return self


ABSENT = _Absent()
_SKIP = object()


def _snapshot(value: Any) -> Any:
    """A comparable copy of a config value, or ``_SKIP`` (sub-configs, methods, objects)."""
    if isinstance(value, _LITERALS) or value is ABSENT:
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, _LITERALS) for v in value):
        return tuple(value)
    return _SKIP


def _same(now: Any, then: Any) -> bool:
    if now is then:
        return True
    if isinstance(then, tuple) and isinstance(now, list):
        now = tuple(now)
    return type(now) is type(then) and now == then


def _reset_message(path: str, what: str, then: Any, now: Any, site: str) -> str:
    at = f" (read at {site})" if site else ""
    return (f"'{path or '<root>'}' was traced with {what} = {then!r}{at} but it is {now!r} "
            "now; the traced graph fixed what the model code did with it")


# ---------------------------------------------------------------------------- dtype / device
@has_side_effect
def check_tensor_attr(value: Any, attr: str, expected: Any, name: str, site: str,
                      path: str) -> None:
    """Guard of a tensor attribute (``dtype``, ``device`` ...) the tracer answered from the
    example value: it must be what it was when the module was traced."""
    now = getattr(value, attr)
    if now != expected:
        mixed = (" (a runtime computing in a lower precision than the fp32 weights it keeps, "
                 "FSDP2 or DeepSpeed: trace inside slapo.compute_dtype(dtype))"
                 if attr == "dtype" else "")
        raise TraceError(
            _reset_message(path, f"{name}.{attr}", expected, now, site),
            hint=f"trace with example inputs and weights of the {attr} you run with "
            f"(model.to(...) before trace(){mixed}), or make the module reading it a leaf "
            "(trace(leaves=[...]))")


# ---------------------------------------------------------------------------- config reads
def _config_class() -> Optional[type]:
    module = sys.modules.get("transformers.configuration_utils")
    return getattr(module, "PretrainedConfig", None)


def configs_of(root: nn.Module) -> List[Any]:
    """The HF config objects held by modules of ``root`` and their sub-configs, each once."""
    base = _config_class()
    if base is None:
        return []
    found: Dict[int, Any] = {}

    def add(obj: Any) -> None:
        if isinstance(obj, base) and id(obj) not in found:
            found[id(obj)] = obj
            for v in list(vars(obj).values()):
                add(v)

    for m in root.modules():
        for v in list(vars(m).values()):
            add(v)
    return list(found.values())


_ACTIVE: List["ConfigReads"] = []


@functools.lru_cache(maxsize=None)
def _internal_files(cls: type) -> frozenset:
    """Source files of ``cls`` and its bases: reads from there (properties, ``attribute_map``)
    are the config's own business, not the model code's."""
    files = set()
    for c in cls.__mro__:
        module = sys.modules.get(c.__module__)
        path = getattr(module, "__file__", None)
        if path:
            files.add(path)
    return frozenset(files)


@functools.lru_cache(maxsize=None)
def _recording_class(base: type) -> type:
    """A subclass of the config class ``base`` whose attribute reads are recorded."""
    internal = _internal_files(base)

    def __getattribute__(self: Any, name: str) -> Any:
        try:
            value = base.__getattribute__(self, name)  # type: ignore[call-arg]
        except AttributeError:
            _record(self, name, ABSENT, internal)
            raise
        if not name.startswith("__"):
            _record(self, name, value, internal)
        return value

    return type(base.__name__, (base,), {"__getattribute__": __getattribute__,
                                         "__qualname__": base.__qualname__,
                                         "__module__": base.__module__})


def _record(config: Any, name: str, value: Any, internal: frozenset) -> None:
    if not _ACTIVE or _ACTIVE[-1].paused:
        return
    caller = sys._getframe(2).f_code
    if caller.co_filename in internal or caller.co_filename.startswith(_TRACE_PACKAGE):
        return
    snap = _snapshot(value)
    if snap is not _SKIP:
        site = f"{os.path.basename(caller.co_filename)}:{sys._getframe(2).f_lineno}"
        _ACTIVE[-1].record(config, name, snap, site)


class ConfigReads:  # a context manager used like a function
    """Inside the block, the attributes the model code reads from the config objects of
    ``root`` (:func:`configs_of`) are recorded in :attr:`reads` (first read wins):
    ``{id(config): (config, {name: (value, site)})}``. :meth:`paused` blocks are not recorded
    (leaf modules and value propagation, which run again on every call)."""

    def __init__(self, root: nn.Module):
        self.configs = configs_of(root)
        self.reads: Dict[int, Tuple[Any, Dict[str, Tuple[Any, str]]]] = {}
        self.paused = 0

    def record(self, config: Any, name: str, value: Any, site: str) -> None:
        _, names = self.reads.setdefault(id(config), (config, {}))
        names.setdefault(name, (value, site))

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    def __enter__(self) -> "ConfigReads":
        self._classes = [(c, type(c)) for c in self.configs]
        for c, cls in self._classes:
            c.__class__ = _recording_class(cls)  # type: ignore[arg-type]
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.remove(self)
        for c, cls in self._classes:
            c.__class__ = cls


# ---------------------------------------------------------------------------- module flags
def _reads_flag(cls: type, flag: str) -> bool:
    """Whether the forward (or an overridden ``__call__``) of ``cls`` reads ``self.<flag>``."""
    for name in ("forward", "__call__"):
        fn = getattr(cls, name, None)
        if fn is None or (name == "__call__" and fn is nn.Module.__call__):
            continue
        while hasattr(fn, "__wrapped__"):
            if flag in getattr(getattr(fn, "__code__", None), "co_names", ()):
                return True
            fn = fn.__wrapped__
        if flag in getattr(getattr(fn, "__code__", None), "co_names", ()):
            return True
    return False


def module_flags(root: nn.Module, inlined: List[Tuple[str, nn.Module]]
                 ) -> List[Tuple[str, str, Any]]:
    """``(module path, flag, value)`` for each :data:`MODULE_FLAGS` attribute that the code of
    an inlined module (``(path, module)``; ``""`` for the root) reads."""
    out = []
    for path, m in inlined:
        for flag in MODULE_FLAGS:
            value = getattr(m, flag, ABSENT)
            if isinstance(value, bool) and _reads_flag(type(m), flag):
                out.append((path, flag, value))
    return out


# ---------------------------------------------------------------------------- output capture
@functools.lru_cache(maxsize=None)
def _recorded_by_class(cls: type) -> frozenset:
    """Keys of HF's output capture whose target class ``cls`` is an instance of, from the
    ``_can_record_outputs`` tables of the models defined beside ``cls``."""
    module = sys.modules.get(cls.__module__)
    keys = set()
    for obj in list(vars(module).values()) if module is not None else ():
        table = getattr(obj, "_can_record_outputs", None) if isinstance(obj, type) else None
        if not isinstance(table, dict):
            continue
        for key, specs in table.items():
            for spec in specs if isinstance(specs, (list, tuple)) else [specs]:
                target = spec if isinstance(spec, type) else getattr(spec, "target_class", None)
                if isinstance(target, type) and issubclass(cls, target):
                    keys.add(key)
    return frozenset(keys)


def capture_keys(inlined: List[Tuple[str, nn.Module]]) -> frozenset:
    """Output-capture keys (``attentions``, ``hidden_states`` ...) HF would collect from a
    module of ``inlined`` with a forward hook."""
    keys: set = set()
    for _, m in inlined:
        keys |= _recorded_by_class(type(m))  # type: ignore[arg-type]
    return frozenset(keys)


def _collector() -> Any:
    module = sys.modules.get("transformers.utils.output_capturing")
    return getattr(module, "_active_collector", None)


# ---------------------------------------------------------------------------- the guard
class BakedState:
    """Config attributes and module flags a traced module's graph fixed (see module
    docstring); :meth:`check` raises one line when one of them changed since the trace.

    Args:
        configs: ``(config, ((name, value, site), ...))`` per config object.
        flags: ``(module, relative path, flag, value)``; the traced module itself is bound
            later (:meth:`bind_root`), as the graph module takes its place.
    """

    def __init__(self, configs: List[Tuple[Any, Tuple[Tuple[str, Any, str], ...]]],
                 flags: List[Tuple[Optional[nn.Module], str, str, Any]],
                 captured: frozenset = frozenset()):
        self.configs = configs
        self.flags = flags
        self.captured = captured  # output-capture keys of inlined modules

    @classmethod
    def of(cls, reads: ConfigReads, root: nn.Module, inlined: List[Tuple[str, nn.Module]]
           ) -> "BakedState":
        """The state of a trace of ``root`` that inlined the code of ``inlined``."""
        configs = [(c, tuple((n, v, s) for n, (v, s) in names.items()))
                   for c, names in reads.reads.values()]
        held = [(root.get_submodule(p) if p else None, p, f, v)
                for p, f, v in module_flags(root, inlined)]
        return cls(configs, held, capture_keys(inlined))

    def __bool__(self) -> bool:
        return bool(self.configs or self.flags or (self.captured and _collector() is not None))

    def bind_root(self, gm: nn.Module) -> None:
        """The traced module (the graph module) holds the root's flags from now on."""
        for i, (m, p, f, v) in enumerate(self.flags):
            if m is None:
                gm.__dict__[f] = v
                self.flags[i] = (gm, p, f, v)

    def check(self, path: str) -> None:
        for config, reads in self.configs:
            for name, then, site in reads:
                now = getattr(config, name, ABSENT)
                if not _same(now, then):
                    raise TraceError(
                        _reset_message(path, f"config.{name}", then, now, site),
                        hint=f"set config.{name} before tracing (re-create the schedule and "
                        "trace again), or make the module reading it a leaf "
                        "(trace(leaves=[...]))")
        for m, where, flag, then in self.flags:
            now = getattr(m, flag, ABSENT)
            if now is not then:
                what = f"{where}.{flag}" if where else flag
                raise TraceError(
                    _reset_message(path, what, then, now, ""),
                    hint=f"the graph inlined the code that reads {flag}: set it before "
                    "tracing, make that module a leaf (trace(leaves=[...])), or use slapo's "
                    "checkpoint primitive instead")
        collector = _collector() if self.captured else None  # a ContextVar: not kept (copies)
        if collector is not None:
            active = collector.get()
            if active and not self.captured.isdisjoint(active):
                keys = ", ".join(sorted(self.captured.intersection(active)))
                raise TraceError(
                    f"'{path or '<root>'}' inlined the code of modules whose {keys} HF "
                    "collects with forward hooks (output_attentions / output_hidden_states), "
                    "so they would be missing from the model's output",
                    hint="make those modules leaves (trace(leaves=[...])) to collect them, "
                    "or run without asking for them")


@has_side_effect
def check_baked(state: BakedState, path: str) -> None:
    """Guard node of a traced graph: :meth:`BakedState.check`."""
    state.check(path)
