"""What ``verify`` runs: the scheduled module (the whole model or one sub-module), its unscheduled
reference, the inputs of that module, and real weights for both when they are on meta.

* **One sub-module.** ``verify(sch["encoder.layer.0"], ...)`` compares that module's schedule
  with the same module of the original model, on that module's own inputs: given as
  ``inputs=``, or captured (a forward pre-hook; the run stops there) from a run of the original
  model on ``example_inputs``. A layer of a model too large to run whole is verified by itself.
* **Delayed-init (meta) models.** The reference copy and the scheduled module are materialised
  with the same deterministic initialisation as ``slapo.build`` (each module under
  ``module_seed(init_seed, path)``, this rank's shards only), so a schedule of a model built
  under ``init_empty_weights()`` is verified without the user ever building it in full; the
  scheduled module's meta tensors are put back afterwards. Replacements made on the meta model
  (a fused ``qkv_proj``) never held the originals' values: :func:`load_derived` gives them the
  original's values through their provenance records, so their gradients are compared.
"""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn

from ..errors import VerifyError
from ..primitives.trace import as_inputs, capture_inputs
from ..provenance import derived_parameters
from ..schedule import Schedule
from ..sharding.spec import get_shard_spec
from ..trace.stand_ins import has_meta
from ..trace.tracer import Inputs
from ..weights.delayed_init import InitFn, materialize
from .tools import Difference, VerifyReport, compare

__all__ = ["reference_of", "inputs_of", "check_device", "materialized", "load_derived",
           "map_tensors", "grad_leaves", "compare_input_grads", "full_paths"]


def _original_root(sch: Schedule, reference: Optional[nn.Module]) -> nn.Module:
    src = reference if reference is not None else getattr(sch.root, "original", None)
    if src is None:
        raise VerifyError("no original model to compare with", call="verify", path=sch.path,
                          hint="pass reference=<unscheduled model>, create the schedule with "
                          "create_schedule(model, keep_original=True), or use a Verify block")
    return src


def reference_of(sch: Schedule, reference: Optional[nn.Module]) -> Tuple[nn.Module, nn.Module]:
    """``(original root or None, original counterpart of sch.mod)``; ``reference`` may be the
    whole unscheduled model or, for a sub-module, that module alone."""
    src = _original_root(sch, reference)
    if sch.parent is None:
        return src, src
    try:
        return src, src.get_submodule(sch.path)
    except AttributeError:
        return None, src  # given the sub-module's own reference


def inputs_of(sch: Schedule, ref_root: Optional[nn.Module], example_inputs: Any, inputs: Any,
              init_weights: InitFn, device: Any, seed: int) -> Inputs:
    """The inputs of ``sch.mod``: ``inputs`` as given, the model's ``example_inputs`` for the
    root, or a sub-module's inputs captured from the original model run on them (a meta
    original is materialised for that run: pass ``inputs=`` for a model too large for it)."""
    if inputs is not None:
        return as_inputs(inputs)
    if example_inputs is None:
        raise VerifyError("no inputs to verify with", call="verify", path=sch.path,
                          hint="pass example_inputs (of the whole model) or inputs=(args, "
                          "kwargs) of this module")
    if sch.parent is None:
        return as_inputs(example_inputs)
    if ref_root is None:
        raise VerifyError("a sub-module's reference was given alone, so its inputs cannot be "
                          "captured from a run of the model", call="verify", path=sch.path,
                          hint="pass inputs=(args, kwargs) of the module, or reference=<the "
                          "whole unscheduled model>")
    if has_meta(ref_root):
        ref_root = materialize(copy.deepcopy(ref_root), _init_or_fail(init_weights, sch),
                               device=device, seed=seed)
    target = ref_root.get_submodule(sch.path)
    return capture_inputs(ref_root, target, example_inputs, sch.path)


def check_device(sch: Schedule, device: Any, inputs: Any) -> None:
    """``device=`` places the weights a meta model is materialised with; verify never moves a
    model or inputs. The original Slapo's ``Verify(..., device="cuda")`` moved both there, so a
    real weight or an input on another device is an error, not a silent run elsewhere."""
    want = torch.device(device)
    found = []
    map_tensors(inputs, found.append)
    tensors = [t for t in list(sch.mod.parameters()) + list(sch.mod.buffers()) if not t.is_meta]
    for what, ts in (("the scheduled module's weights are", tensors), ("the inputs are", found)):
        have = ts[0].device if ts else want
        if have.type != want.type or (None not in (have.index, want.index)
                                      and have.index != want.index):
            raise VerifyError(
                f"device={device!r}, but {what} on '{have}'; verify runs the model and the "
                "inputs where they are (the original Slapo's Verify moved both to device)",
                call=f"verify(device={device!r})", path=sch.path,
                hint=f"move both there first: model.to({str(want)!r}) and the inputs "
                f".to({str(want)!r}); device= only places the weights of a meta "
                "(init_empty_weights) model")


def _init_or_fail(init_weights: InitFn, sch: Schedule) -> InitFn:
    if init_weights is None or init_weights is False:
        raise VerifyError("the model has weights on the meta device and verify was given "
                          "init_weights=None", call="verify", path=sch.path,
                          hint="pass init_weights=True (the modules' own initialisers, as "
                          "build() does) or a function init_weights(module)")
    return init_weights


@contextlib.contextmanager
def materialized(sch: Schedule, ref: nn.Module, init_weights: InitFn, device: Any,
                 seed: int) -> Iterator[Tuple[nn.Module, bool]]:
    """Yield a copy of ``ref`` with real weights, and whether ``sch.mod`` was on meta; inside,
    ``sch.mod`` has real weights (materialised in place, like ``build`` would, and put back on
    meta on exit)."""
    ref_model = copy.deepcopy(ref)
    if has_meta(ref_model):  # the values the same module gets inside the whole model
        materialize(ref_model, _init_or_fail(init_weights, sch), device=device, seed=seed,
                    path=sch.path, init_owner=_hf_model_above(sch))
    if not has_meta(sch.mod):
        yield ref_model, False
        return
    slots = _tensor_slots(sch.mod)
    materialize(sch, _init_or_fail(init_weights, sch), device=device, seed=seed)
    try:
        yield ref_model, True
    finally:
        for table, name, t in slots:
            table[name] = t


def load_derived(ref_model: nn.Module, model: nn.Module) -> None:
    """Give the parameters that hold renamed or re-laid originals (provenance records) the
    originals' values, each rank its shard. A record's ``to_original`` is a pure re-layout, so
    applied to tensors of element *indices* it says where each original element lives. Used for
    freshly materialised meta models, whose replacements never had the originals' values."""
    params = dict(model.named_parameters())
    ref = dict(ref_model.named_parameters())
    sources = {o: s for o, s in derived_parameters(model).items()
               if o not in params and o in ref}
    names = sorted({n for s in sources.values() for n in s.params})
    index, total = {}, 0
    for n in names:
        spec = get_shard_spec(params[n])
        shape = tuple(spec.global_shape) if spec is not None else tuple(params[n].shape)
        numel = math.prod(shape)
        index[n] = torch.arange(total, total + numel, dtype=torch.float64).reshape(shape)
        total += numel
    values = torch.full((total,), float("nan"), dtype=torch.float64)
    for o, src in sources.items():
        where = src(*[index[n] for n in src.params])
        if tuple(where.shape) == tuple(ref[o].shape):
            values[where.reshape(-1).long()] = ref[o].detach().double().reshape(-1).cpu()
    with torch.no_grad():
        for n in names:
            p, spec = params[n], get_shard_spec(params[n])
            local = spec.slice_of(index[n]) if spec is not None else index[n]
            v = values[local.reshape(-1).long()].reshape(local.shape).to(p.device)
            p.copy_(torch.where(torch.isnan(v), p.double(), v).to(p.dtype))


def _hf_model_above(sch: Schedule) -> Optional[nn.Module]:
    """The nearest enclosing module with HF's ``_init_weights`` (which reads only its config),
    as initialisation inside the whole model would use."""
    node = sch.parent
    while node is not None and not callable(getattr(node.mod, "_init_weights", None)):
        node = node.parent
    return None if node is None else node.mod


def _tensor_slots(model: nn.Module) -> List[Tuple[Dict[str, Any], str, Any]]:
    """Every (table, name, tensor) of the model's parameters and buffers, to put back."""
    return [(table, name, t) for mod in model.modules()
            for table in (mod._parameters, mod._buffers) for name, t in table.items()]


# ---------------------------------------------------------------- inputs, gradients, names
def map_tensors(value: Any, fn) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    return value


def grad_leaves(inputs: Any) -> Any:
    """The inputs with every floating-point tensor a fresh leaf that requires grad."""
    return map_tensors(inputs, lambda t: t.detach().clone().requires_grad_(True)
                        if t.is_floating_point() else t)


def compare_input_grads(report: VerifyReport, ref_inputs: Any, inputs: Any, rtol: float,
                         atol: float) -> None:
    """A sub-module's input gradients (what its schedule sends back to the layers before it,
    e.g. through a backward all-reduce) must match too; keyed ``<input args[i]>`` /
    ``<input 'name'>``."""
    (ref_args, ref_kwargs), (args, kwargs) = ref_inputs, inputs
    pairs = [(f"<input args[{i}]>", a, b) for i, (a, b) in enumerate(zip(ref_args, args))]
    pairs += [(f"<input {k!r}>", ref_kwargs[k], kwargs.get(k)) for k in ref_kwargs]
    for name, ref_t, t in pairs:
        if isinstance(ref_t, torch.Tensor) and ref_t.grad is not None:
            got = t.grad if isinstance(t, torch.Tensor) else None
            report.grads[name] = (compare(got, ref_t.grad, rtol, atol) if got is not None else
                                  Difference(float("inf"), float("inf"), False, "no grad"))


def full_paths(report: VerifyReport, prefix: str) -> None:
    """Module and parameter names of a sub-module's report, as paths in the whole model."""
    def full(name: str) -> str:
        if name.startswith("<input"):
            return name
        return prefix if name == "<root>" else f"{prefix}.{name}"

    for attr in ("first_divergence", "first_grad_divergence", "error"):
        value = getattr(report, attr)
        if value is not None:
            setattr(report, attr, (full(value[0]), value[1]))
    for attr in ("grads", "params_after_step", "derived_values", "derived"):
        setattr(report, attr, {full(k): v for k, v in getattr(report, attr).items()})
    report.unmatched = [full(n) for n in report.unmatched]
