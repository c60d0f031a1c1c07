"""Delayed (meta-device) initialisation: build big models without allocating their weights.

``with slapo.init_empty_weights(): model = Model(config)`` creates every parameter on the ``meta``
device (buffers stay real by default, so HF's ``position_ids`` / rotary ``inv_freq`` keep their
values). The model can then be scheduled and sharded for free; ``slapo.build(sch,
init_weights=...)`` calls :func:`materialize`, which allocates only what this rank keeps.

Values are deterministic and independent of the tensor-parallel degree: every module's initialiser
runs on the module's *full* tensors under its own seed, ``module_seed(seed, path)``, and only then
is this rank's chunk (per the tensor's :class:`~slapo.sharding.ShardSpec`) kept. So a sharded
rank holds exactly the slice that the same procedure on the unsharded model produces, whatever the
TP degree or the order of initialisation. Modules are initialised one unit at a time (a module
with its own tensors, or the few modules whose initialisers write a common tensor, see
:mod:`slapo.weights.init_plan`), so peak memory is the shards plus the largest unit. Real (non-meta)
tensors are never re-initialised: writes to them go to scratch copies.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

import torch
from torch import nn

from ..errors import InitError
from ..trace.original import as_original
from .init_plan import ModuleEntry, TensorTable, Unit, dry_run, plan_units

__all__ = ["init_empty_weights", "has_meta_tensors", "materialize", "module_seed", "InitFn"]

InitFn = Union[bool, None, Callable[..., None]]


@contextlib.contextmanager
def init_empty_weights(enable: bool = True, include_buffers: bool = False) -> Iterator[None]:
    """Create new parameters (and, with ``include_buffers``, all tensors) on the meta device.

    With ``include_buffers=True`` everything created inside the block is on the meta device,
    buffers included; their values must then be recomputed by the initialiser (HF's
    ``_init_weights`` does for ``position_ids`` and rotary ``inv_freq``), otherwise
    :func:`materialize` refuses with an :class:`InitError` naming them.
    """
    if not enable:
        yield
        return
    if include_buffers:
        with torch.device("meta"):
            yield
        return
    original = nn.Module.register_parameter

    def register_parameter(module: nn.Module, name: str, param: Optional[nn.Parameter]) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            p = module._parameters[name]
            module._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    nn.Module.register_parameter = register_parameter  # type: ignore[assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[assignment]


def has_meta_tensors(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` lives on the meta device."""
    return any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))


def module_seed(seed: int, path: str) -> int:
    """The seed of the module at ``path``: a hash of the base ``seed`` and the path."""
    digest = hashlib.sha256(f"{int(seed)}/{path}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def materialize(
    target: Any,
    init_weights: InitFn,
    device: Union[None, str, torch.device] = None,
    seed: int = 0,
    *,
    path: str = "",
    init_owner: Optional[nn.Module] = None,
) -> nn.Module:
    """Allocate the meta tensors of a model (this rank's shards only) and initialise them.

    A sub-module materialised by itself gets the values it gets inside the whole model, given
    its ``path`` and the HF model around it (``init_owner``); for a sub-schedule both are found
    from the schedule.

    Args:
        target: a ``Schedule`` (paths are taken from its position) or an ``nn.Module``.
        init_weights: ``True`` for the model's own initialisers (the nearest HF
            ``PreTrainedModel._init_weights``, else the module's ``reset_parameters()``); a
            callable ``fn(module)`` or ``fn(module, path)`` (chosen by arity) that fills the
            module's tensors in place; ``None``/``False`` is only valid without meta tensors.
        device: where meta tensors are materialised (default: the current CUDA device when
            available, else CPU). Real tensors are not moved.
        seed: base seed; module ``path`` is initialised under ``module_seed(seed, path)``.
        path: for an ``nn.Module`` target, its path in the whole model (the seeds' prefix).
        init_owner: with ``init_weights=True``, the HF model whose ``_init_weights`` handles
            modules that no HF model inside ``target`` does (default: for a sub-schedule, the
            nearest enclosing HF model; else none).

    Returns:
        the model, with every meta tensor replaced by a materialised one (sharded tensors keep
        their ``ShardSpec`` and annotations; tied tensors stay tied).

    Raises:
        InitError: meta tensors but no ``init_weights``; an unusable ``init_weights``; a meta
            tensor that no initialiser writes (named); a shard spec that does not match its
            tensor; an initialiser that fails (its module is named).
    """
    from ..schedule import Schedule  # imported here: schedule -> primitives -> ... -> init

    if isinstance(target, Schedule):
        model, prefix = target.mod, target.path
        init_owner = init_owner if init_owner is not None else _enclosing_hf_model(target)
    else:
        model, prefix = target, path
    if not isinstance(model, nn.Module):
        raise InitError(f"expected a Schedule or nn.Module, got {type(target).__name__}",
                        call="materialize", hint="pass the schedule given to build()")
    if not has_meta_tensors(model):
        return model
    if init_weights is None or init_weights is False:
        raise InitError(
            "the model has parameters on the meta device but build() was given no init_weights",
            call="build", path=prefix,
            hint="pass init_weights=True (modules' own initialisers) or a function "
            "init_weights(module)",
        )
    device = _resolve_device(device)
    table = TensorTable(model)
    for m in table.modules:
        m.path = _join(prefix, m.path)
    raw_init = _initializer(init_weights, model, init_owner)

    def call_init(m: ModuleEntry) -> bool:
        with as_original(m.module) as module, _global_attributes(module):
            return raw_init(m, module)

    _check_specs(table)
    units = plan_units(table, dry_run(table, call_init))
    _check_coverage(table, units, init_weights)
    for unit in units:
        _run_unit(table, unit, call_init, device, seed)
    for e in table.entries:
        e.restore()
    return model


# ---------------------------------------------------------------------------- initialisers
def _initializer(init_weights: InitFn, model: nn.Module, init_owner: Optional[nn.Module] = None,
                 ) -> Callable[[ModuleEntry, nn.Module], bool]:
    """``call(entry, module) -> bool``: initialise one module, or return False if it has no
    initialiser. A traced module is presented as the original it was traced from
    (:func:`slapo.trace.original.as_original`), since initialisers dispatch on the class."""
    if callable(init_weights):
        with_path = _takes_path(init_weights)

        def call_fn(m: ModuleEntry, module: nn.Module) -> bool:
            init_weights(module, m.path) if with_path else init_weights(module)
            return True

        return call_fn
    if init_weights is not True:
        raise InitError(f"init_weights must be True, None/False or a callable, got "
                        f"{init_weights!r}", call="build",
                        hint="pass init_weights=True or init_weights=fn(module)")
    hf_owner = _nearest_hf_model(model)

    def call_default(m: ModuleEntry, module: nn.Module) -> bool:
        owner = hf_owner.get(id(m.module), init_owner)
        if owner is not None:
            owner._init_weights(module)
            return True
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()
            return True
        return False

    return call_default


def _takes_path(fn: Callable) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not positional:
        raise InitError(f"init_weights {getattr(fn, '__name__', fn)!r} takes no positional "
                        "argument", call="build",
                        hint="define it as fn(module) or fn(module, path)")
    return len(positional) >= 2


def _enclosing_hf_model(sch: Any) -> Optional[nn.Module]:
    """The nearest proper ancestor of a sub-schedule's module with ``_init_weights``."""
    node = sch.parent
    while node is not None:
        if callable(getattr(node.mod, "_init_weights", None)):
            return node.mod
        node = node.parent
    return None


def _nearest_hf_model(model: nn.Module) -> Dict[int, nn.Module]:
    """For every module: the nearest enclosing module (itself included) with ``_init_weights``
    (a HF ``PreTrainedModel``), as HF's own initialisation dispatches it."""
    owner: Dict[int, nn.Module] = {}

    def walk(mod: nn.Module, current: Optional[nn.Module]) -> None:
        if callable(getattr(mod, "_init_weights", None)):
            current = mod
        if current is not None:
            owner.setdefault(id(mod), current)
        for child in mod.children():
            if id(child) not in owner:
                walk(child, current)

    walk(model, None)
    return owner


# ---------------------------------------------------------------------------- checks
def _check_specs(table: TensorTable) -> None:
    for e in table.entries:
        if e.spec is not None and e.was_meta and tuple(e.tensor.shape) != e.spec.local_shape:
            mod, _ = e.slots[0]
            raise InitError(
                f"'{e.name}' has shape {tuple(e.tensor.shape)} but its shard spec says "
                f"{e.spec.local_shape} (chunk {e.spec.rank}/{e.spec.world_size} of "
                f"{tuple(e.spec.global_shape)} along axis {e.spec.axis})",
                call="build", module=mod,
                hint="shard tensors with sch[...].shard(...), which keeps the spec in sync")


def _check_coverage(table: TensorTable, units: List[Unit], init_weights: InitFn) -> None:
    """Every meta tensor must be written by some initialiser, or it would hold garbage."""
    written = {k for u in units for k in u.keys}
    missing = [e for e in table.entries if e.was_meta and e.key not in written]
    if not missing:
        return
    e = missing[0]
    mod, _ = e.slots[0]
    names = ", ".join(f"'{m.name}'" for m in missing[:5]) + (" ..." if len(missing) > 5 else "")
    if not e.is_param:
        hint = ("keep buffers real: build the model under init_empty_weights() without "
                "include_buffers=True, or recompute the buffer in init_weights")
    elif init_weights is True:
        hint = (f"{type(mod).__name__} has no reset_parameters() and no HF _init_weights "
                "handles it; pass init_weights=fn(module) that fills its tensors")
    else:
        hint = "make init_weights fill every tensor of the module it is given"
    raise InitError(f"{len(missing)} meta tensor(s) would stay uninitialised: {names}",
                    call="build", path=e.name.rpartition(".")[0] or None, module=mod,
                    hint=hint)


# ---------------------------------------------------------------------------- execution
def _run_unit(table: TensorTable, unit: Unit, call_init: Callable[[ModuleEntry], bool],
              device: torch.device, seed: int) -> None:
    """Materialise the unit's tensors in full, run its initialisers, keep this rank's slices."""
    shown = {k for i in unit.modules for j in table.modules[i].subtree
             for k in table.modules[j].direct}
    full: Dict[int, torch.Tensor] = {}
    for k in unit.keys:
        e = table.entries[k]
        if e.was_meta:
            data = torch.empty(e.full_shape, dtype=e.tensor.dtype, device=device)
        elif e.spec is None:  # real tensor written by an initialiser: write a scratch copy
            data = e.tensor.detach().clone()
        else:
            data = torch.empty(e.full_shape, dtype=e.tensor.dtype, device=e.tensor.device)
        full[k] = e.make(data)
    for k in shown | set(unit.keys):
        e = table.entries[k]
        e.install(full[k] if k in full else e.meta_placeholder())
    try:
        for i in unit.modules:
            m = table.modules[i]
            with _seeded(module_seed(seed, m.path), device), torch.no_grad():
                try:
                    call_init(m)
                except Exception as exc:
                    raise InitError(f"initialising {type(m.module).__name__} failed: {exc}",
                                    call="build", path=m.path, module=m.module,
                                    hint="check init_weights for this module") from exc
        for k in unit.keys:
            e = table.entries[k]
            if e.was_meta:
                e.done = _keep_local(e, e.current())
    finally:
        for k in shown | set(unit.keys):
            table.entries[k].restore()


def _keep_local(e, value: torch.Tensor) -> torch.Tensor:
    if tuple(value.shape) != e.full_shape or value.is_meta:
        raise InitError(f"the initialiser replaced '{e.name}' by a tensor of shape "
                        f"{tuple(value.shape)} on {value.device} (expected {e.full_shape})",
                        call="build", module=e.slots[0][0],
                        hint="initialise tensors in place (e.g. nn.init.normal_(module.weight))")
    data = value.detach()
    local = data
    if e.spec is not None:
        local = e.spec.slice_of(data)
        if local.untyped_storage().data_ptr() == data.untyped_storage().data_ptr():
            local = local.clone()  # a view would keep the full tensor alive
    out = e.make(local)
    out.__dict__.update(e.tensor.__dict__)  # shard spec and annotations
    return out


@contextlib.contextmanager
def _global_attributes(mod: nn.Module) -> Iterator[None]:
    """Show the initialiser the unsharded module: ``shard`` makes size attributes local
    (``out_features``, ``num_embeddings``, the vocab-parallel ``padding_idx``), but an
    initialiser must see the full module (e.g. HF zeroes row ``padding_idx`` of the full
    embedding). The attributes are derived from the full ``weight`` presented to it."""
    saved: Dict[str, Any] = {}
    weight = mod._parameters.get("weight")
    if isinstance(mod, nn.Linear) and weight is not None and weight.dim() == 2:
        saved = {"out_features": mod.out_features, "in_features": mod.in_features}
        mod.out_features, mod.in_features = weight.shape
    elif isinstance(mod, nn.Embedding) and weight is not None and weight.dim() == 2:
        saved = {"num_embeddings": mod.num_embeddings, "embedding_dim": mod.embedding_dim,
                 "padding_idx": mod.padding_idx}
        mod.num_embeddings, mod.embedding_dim = weight.shape
        mod.padding_idx = getattr(mod, "slapo_global_padding_idx", mod.padding_idx)
    try:
        yield
    finally:
        for attr, value in saved.items():
            setattr(mod, attr, value)


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Run the block with the CPU (and ``device``'s CUDA) generator seeded; restore after."""
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.default_generator.manual_seed(seed)
        for idx in cuda:
            with torch.cuda.device(idx):
                torch.cuda.manual_seed(seed)
        yield


def _resolve_device(device: Union[None, str, torch.device]) -> torch.device:
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InitError(f"invalid device {device!r}", call="build",
                        hint="pass e.g. device='cpu' or device='cuda:0'") from exc


def _join(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if prefix and path else prefix or path
