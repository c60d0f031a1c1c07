"""Numerical verification of a schedule against the original model: outputs, gradients of every
original parameter, parameters after optimizer steps, and the first diverging module.

::

    sch = slapo.create_schedule(model, keep_original=True)
    ... primitives ...
    report = slapo.verify(sch, example_inputs)            # raises VerifyError on a mismatch
    exact = slapo.VerifyOptions(dtype=torch.float64, steps=3)
    report = slapo.verify(sch, example_inputs, options=exact)   # = dtype=..., steps=3

    with slapo.Verify(sch, example_inputs):               # verifies the block's primitives
        sch["encoder.layer.0.attention.self.query"].shard("weight", axis=0)

Both models run on every rank from the same weights and inputs (the inputs and the original's
weights are broadcast from the group's first rank). Sharded outputs, parameters and gradients are
gathered (from their ``ShardSpec``, or for activations from the one dimension that is
``world_size`` times smaller) and compared with the original's. ``dtype=torch.float64`` removes
float noise: a mismatch there is a real bug. On a mismatch the report names the first module, in
execution order, whose output differs. Parameters a replacement renamed or re-laid (HF ``query``
-> a fused ``qkv_proj``, GPT-2's Conv1D ``c_attn`` ...) are compared through the provenance
records the replacement carries (:mod:`slapo.provenance`): the full new tensors are mapped back
to the original layout, for values, gradients and parameters after steps.
"""

from __future__ import annotations

import copy
from typing import Any, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from ..errors import VerifyError
from ..schedule import Schedule
from ..sharding.sequence_parallel import reduce_replicated_grads
from ..sharding.spec import get_shard_spec
from ..testing.compare import outputs_of
from .budget import check_memory, estimate_peak
from .options import OPTION_NAMES, VerifyOptions, check_keywords, make_options
from .rules import check_schedule
from .targets import (
    check_device,
    compare_input_grads,
    full_paths,
    grad_leaves,
    inputs_of,
    load_derived,
    map_tensors,
    materialized,
    reference_of,
)
from .tools import (
    DerivedParams,
    Difference,
    OutputComparer,
    OutputRecorder,
    compare,
    default_tolerances,
    first_tensor,
    to_full,
    VerifyReport,
)

__all__ = ["verify", "Verify", "VerifyOptions", "VerifyReport"]

# Keyword arguments of verify: its own and every VerifyOptions field.
VERIFY_KEYWORDS = ("inputs", "reference", *OPTION_NAMES, "options")


def _src_rank(group) -> int:
    return dist.get_global_rank(group, 0) if group is not None else 0


def _distributed(group) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def _broadcast_(t: torch.Tensor, group) -> torch.Tensor:
    t = t.detach().clone().contiguous()
    dist.broadcast(t, _src_rank(group), group=group)
    return t


def _call(model: nn.Module, inputs: Any) -> Any:
    args, kwargs = inputs
    return model(*args, **kwargs)


def _first_device(value: Any) -> Optional[torch.device]:
    found = []
    map_tensors(value, lambda t: found.append(t.device))
    return found[0] if found else None


def _backward_scalar(out: Any, ref_out: Any, group) -> torch.Tensor:
    """The scalar to differentiate: the loss if the model returns one, else a fixed random
    projection of the first output; a partitioned output gets its slice of the projection, so
    the ranks' losses add up to the original's."""
    loss = getattr(out, "loss", None)
    if loss is not None:
        return loss
    t, ref = first_tensor(out), first_tensor(ref_out)
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(ref.shape, generator=g, dtype=torch.float64).to(t.device, t.dtype)
    if tuple(t.shape) != tuple(ref.shape) and _distributed(group):
        axis = [i for i, (a, b) in enumerate(zip(t.shape, ref.shape)) if a != b][0]
        n = t.shape[axis]
        w = w.narrow(axis, dist.get_rank(group) * n, n)
    return (t * w).sum()


class _SavedState:
    """Parameters, buffers, gradients, dtypes and train flag of a model, restored on exit."""

    def __init__(self, model: nn.Module, keep_values: bool = True):
        self.model = model
        self.training = model.training
        self.tensors = [(t, t.data.clone() if keep_values else None, t.grad) for t in
                        list(model.parameters()) + list(model.buffers())]

    def restore(self) -> None:
        for t, data, grad in self.tensors:
            if data is not None:
                t.data = data
            if isinstance(t, nn.Parameter):
                t.grad = grad
        self.model.train(self.training)


def verify(
    sch: Schedule,
    example_inputs: Any = None,
    *,
    inputs: Any = None,
    reference: Optional[nn.Module] = None,
    options: Optional[VerifyOptions] = None,
    **keywords: Any,
) -> VerifyReport:
    """Compare the scheduled model (or one scheduled sub-module) with the original.

    Args:
        sch: the schedule: the root verifies the whole model; ``sch["encoder.layer.0"]``
            verifies that sub-module alone, against the same module of the original, on its
            own inputs (rules are checked for that subtree only).
        example_inputs: inputs of the *whole model*: a dict of keyword inputs or a tuple of
            positional inputs. For a sub-module, its inputs are captured from a run of the
            original model on them (stopped once the module is reached).
        inputs: the verified module's own inputs, instead: ``(args, kwargs)``, a tuple of
            positional inputs or a dict of keyword inputs (e.g. a layer's hidden states, for a
            model too large to run whole).
        reference: the original, unscheduled model (for a sub-module also: that module
            alone); defaults to the copy kept by ``create_schedule(model, keep_original=True)``
            or by a ``Verify`` block. It is copied, never modified.
        options: how to compare (:class:`~slapo.VerifyOptions`: gradients, dtype, tolerances,
            SGD steps, rules, materialising a meta model, raising); default: its defaults.
        **keywords: any field of :class:`~slapo.VerifyOptions` by name (``dtype=``,
            ``steps=``, ``raise_on_mismatch=`` ...), as a shorthand for ``options=``; given
            together with ``options=``, each must agree with it.

    Raises:
        VerifyError: a rule problem or a numerical mismatch (unless
            ``raise_on_mismatch=False``), a weight or an input on another ``device``, an unknown
            keyword (with the closest name), or a keyword contradicting ``options=``.

    The scheduled model's weights, gradients, dtypes and mode are restored afterwards.
    """
    check_keywords(keywords, VERIFY_KEYWORDS, "verify")
    opts = make_options(options, keywords, "verify")
    root = sch.root
    group = root.group
    if opts.device is not None:
        check_device(sch, opts.device, inputs if inputs is not None else example_inputs)
    if opts.rules:
        report = _check_rules(sch, opts.raise_on_mismatch)
        if report is not None:
            return report
    ref_root, ref_src = reference_of(sch, reference)
    device = opts.device
    if device is None:
        device = _first_device(inputs if inputs is not None else example_inputs)
    inputs = inputs_of(sch, ref_root, example_inputs, inputs, opts.init_weights, device,
                       opts.init_seed)
    if opts.check_memory:
        estimate = estimate_peak(ref_src, sch.mod, inputs, whole=sch.parent is None,
                                 backward=opts.check_grads or opts.steps > 1, dtype=opts.dtype,
                                 config=getattr(root.mod, "config", None))
        check_memory(estimate, device, group, sub_module=sch.parent is not None)
    distributed = _distributed(group)
    if distributed:
        inputs = map_tensors(inputs, lambda t: _broadcast_(t, group))
    with materialized(sch, ref_src, opts.init_weights, device, opts.init_seed) as pair:
        ref_model, fresh = pair
        model = sch.mod
        if distributed:  # into the copy's own tensors: no second copy of the original
            for t in list(ref_model.parameters()) + list(ref_model.buffers()):
                if t.is_contiguous():
                    dist.broadcast(t.data, _src_rank(group), group=group)
                else:
                    t.data = _broadcast_(t.data, group)
        saved = _SavedState(model, keep_values=not fresh)  # fresh: meta again on exit
        try:
            if opts.load_weights:
                _load_reference_weights(ref_model, model)
                if fresh:
                    load_derived(ref_model, model)
            report = _run(ref_model, model, inputs, group, opts, input_grads=sch.parent is not None)
        finally:
            saved.restore()
    if sch.path:
        full_paths(report, sch.path)
    report.rank = dist.get_rank() if dist.is_initialized() else 0
    _raise_on_mismatch(report, group, distributed, opts)
    return report


def _check_rules(sch: Schedule, raise_on_mismatch: bool) -> Optional[VerifyReport]:
    """The failed report of the schedule's rule problems (in ``sch``'s subtree), if any."""
    root = sch.root
    problems = check_schedule(root)
    if sch is not root:
        problems = [p for p in problems if p.path == sch.path
                    or str(p.path).startswith(sch.path + ".")]
    if not problems:
        return None
    report = VerifyReport(problems=problems, ok=False,
                          rank=dist.get_rank() if dist.is_initialized() else 0)
    if raise_on_mismatch:
        raise VerifyError(str(report), call="verify",
                          hint="fix the listed rule violations (or rules=False to run "
                          "the numerical check anyway)")
    return report


def _raise_on_mismatch(report: VerifyReport, group, distributed: bool,
                       opts: VerifyOptions) -> None:
    """Raise VerifyError if any rank failed (all ranks agree on it), unless told not to."""
    ok = torch.tensor([1 if report.ok else 0])
    if distributed:
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    if opts.raise_on_mismatch and not bool(ok.item()):
        if report.ok:
            raise VerifyError("verification failed on another rank (this rank matched)",
                              call="verify", hint="see that rank's error for the details")
        raise VerifyError(str(report), call="verify", hint=_hint(report, opts.dtype))


def _hint(report: VerifyReport, dtype: Optional[torch.dtype]) -> str:
    if report.error is not None:
        return f"the error happened in '{report.error[0]}'; check how it was scheduled"
    failing = [d for group in (report.outputs, report.grads, report.derived_values)
               for d in group.values() if not d.ok]
    worst = max((d.max_rel for d in failing), default=0.0)
    if dtype == torch.float64 and failing and worst < _FLOAT32_LEVEL:
        where = (f" (first at '{report.first_divergence[0]}')"
                 if report.first_divergence is not None else "")
        return (f"every difference is at float32 rounding level (max rel {worst:.1e}){where}: "
                "one side computes part of the model in float32 whatever the dtype (HF's "
                "GPT-Neo attention does); verify in float32 (no dtype=), or pass rtol=1e-4")
    if report.first_divergence is not None:
        return (f"inspect the schedule of '{report.first_divergence[0]}' (print(sch) shows what "
                "changed there)")
    if dtype != torch.float64:
        return "re-run with dtype=torch.float64: a mismatch that persists is a real bug"
    return "check the syncs of sharded modules (slapo.explain(sch))"


_FLOAT32_LEVEL = 1e-4  # relative differences below this in a float64 run are float32 rounding


def _run(ref_model, model, inputs, group, opts: VerifyOptions,
         input_grads: bool = False) -> VerifyReport:
    """Run both models ``opts.steps`` times from the same seed and compare outputs (first step),
    gradients (first step; of the module's inputs too with ``input_grads``) and parameters after
    each SGD step. Forward-only runs keep no autograd graph. On a mismatch in the first step,
    that step is run again recording module outputs to name the first diverging module."""
    if opts.dtype is not None:
        ref_model.to(opts.dtype)
        model.to(opts.dtype)
        inputs = map_tensors(inputs, lambda t: t.to(opts.dtype) if t.is_floating_point() else t)
    tol = _tolerances(opts, opts.dtype or next(ref_model.parameters()).dtype)
    ref_model.train(not opts.eval_mode)
    model.train(not opts.eval_mode)
    sch_params = dict(model.named_parameters())
    ref_params = dict(ref_model.named_parameters())
    derived = DerivedParams(model, ref_params, sch_params)
    report = VerifyReport(derived=derived.held_as())
    report.unmatched = [n for n in ref_params if n not in sch_params and n not in derived.sources]
    for name, value in derived.rebuild(group, grad=False).items():
        report.derived_values[name] = compare(value, ref_params[name].data, *tol)
    sgd = [torch.optim.SGD(m.parameters(), lr=opts.lr) for m in (ref_model, model)]
    backward = opts.check_grads or opts.steps > 1
    for step in range(opts.steps):
        ran = _step(ref_model, model, inputs, group, opts, tol, report, step,
                    input_grads and step == 0)
        if not ran:
            break
        if step == 0 and opts.check_grads:
            _compare_grads(report, derived, ref_params, sch_params, group, tol)
        if step == 0 and opts.localize and report.failures():
            _localize(ref_model, model, inputs, group, opts, tol, report, backward)
        if opts.steps > 1:
            for o in sgd:
                o.step()
            _compare_params(report, derived, ref_params, sch_params, group, tol)
    report.ok = not report.failures()
    if report.ok:
        report.first_divergence = report.first_grad_divergence = None
    return report


def _step(ref_model, model, inputs, group, opts: VerifyOptions, tol, report: VerifyReport,
          step: int, input_grads: bool) -> bool:
    """One run of both models (outputs compared in the first step, backward when gradients
    or SGD steps are asked for); ``False`` when the scheduled model raised (reported with the
    module it raised in)."""
    backward = opts.check_grads or opts.steps > 1
    for m in (ref_model, model):
        m.zero_grad(set_to_none=True)
    ref_inputs, sch_inputs = ((grad_leaves(inputs), grad_leaves(inputs)) if input_grads
                              else (inputs, inputs))
    tracker = OutputRecorder(model, keep=False)  # which module raised, nothing held
    with torch.set_grad_enabled(backward):
        torch.manual_seed(opts.seed + step)
        ref_out = _call(ref_model, ref_inputs)
        torch.manual_seed(opts.seed + step)
        try:
            out = _call(model, sch_inputs)
        except Exception as e:  # noqa: BLE001 - reported with the module that raised
            where = tracker.active[-1] if tracker.active else "<root>"
            report.error = (where, f"{type(e).__name__}: {e}".splitlines()[0][:300])
            return False
        finally:
            tracker.remove()
    if step == 0:
        _compare_outputs(report, ref_out, out, group, tol)
    if backward:
        _backward_scalar(ref_out, ref_out, None).backward()
        _backward_scalar(out, ref_out, group).backward()
        _reduce_replicated_grads(model, group)
    if input_grads and opts.check_grads:
        compare_input_grads(report, ref_inputs, sch_inputs, *tol)
    return True


def _localize(ref_model, model, inputs, group, opts: VerifyOptions, tol, report: VerifyReport,
              backward: bool) -> None:
    """Run the first step again, recording the original's module outputs (and their gradients)
    and comparing the scheduled model's with them as they are produced: the first diverging
    module, forward and backward. Leaves the same gradients as the first run."""
    for m in (ref_model, model):
        m.zero_grad(set_to_none=True)
    reference = OutputRecorder(ref_model)
    with torch.set_grad_enabled(backward):
        torch.manual_seed(opts.seed)
        ref_out = _call(ref_model, inputs)
        reference.remove()
        mine = OutputComparer(model, reference, group, *tol)
        torch.manual_seed(opts.seed)
        try:
            out = _call(model, inputs)
        finally:
            mine.remove()
    if backward:
        _backward_scalar(ref_out, ref_out, None).backward()
        _backward_scalar(out, ref_out, group).backward()
        _reduce_replicated_grads(model, group)
    report.first_divergence = mine.first_divergence
    report.first_grad_divergence = mine.first_grad_divergence


def _tolerances(opts: VerifyOptions, run_dtype: torch.dtype) -> Tuple[float, float]:
    """``(rtol, atol)``: the options', else the defaults of the dtype the models run in."""
    d_rtol, d_atol = default_tolerances(run_dtype)
    return (d_rtol if opts.rtol is None else opts.rtol,
            d_atol if opts.atol is None else opts.atol)


def _compare_outputs(report: VerifyReport, ref_out: Any, out: Any, group, tol) -> None:
    """Each output of the original against the scheduled model's (gathered if partitioned)."""
    ref_t, sch_t = outputs_of(ref_out), outputs_of(out)
    for k, t in ref_t.items():
        mine = sch_t.get(k)
        report.outputs[k] = (compare(to_full(mine, group, like=t), t, *tol)
                             if mine is not None else
                             Difference(float("inf"), float("inf"), False, "missing"))


def _compare_grads(report: VerifyReport, derived: DerivedParams, ref_params, sch_params, group,
                   tol) -> None:
    """The gradient of every original parameter: of the same-named scheduled one (gathered),
    or rebuilt from a replacement's provenance record."""
    rebuilt = derived.rebuild(group, grad=True)
    for name, p in ref_params.items():
        q = sch_params.get(name)
        if p.grad is None or (q is None and name not in rebuilt):
            continue
        got = rebuilt[name] if q is None else (
            None if q.grad is None else to_full(q.grad, group, p.grad, param=q))
        report.grads[name] = (compare(got, p.grad, *tol) if got is not None else
                              Difference(float("inf"), float("inf"), False, "no grad"))


def _compare_params(report: VerifyReport, derived: DerivedParams, ref_params, sch_params, group,
                    tol) -> None:
    """Every original parameter after an SGD step against the scheduled one (or rebuilt)."""
    rebuilt = derived.rebuild(group, grad=False)
    for name, p in ref_params.items():
        q = sch_params.get(name)
        if q is not None or name in rebuilt:
            got = rebuilt[name] if q is None else to_full(q.data, group, p.data, param=q)
            report.params_after_step[name] = compare(got, p.data, *tol)


def _load_reference_weights(ref_model: nn.Module, model: nn.Module) -> None:
    """Copy each original parameter/buffer into the scheduled one of the same name (this rank's
    shard of it when sharded). Shapes that do not match are left alone."""
    ref = dict(ref_model.named_parameters()) | dict(ref_model.named_buffers())
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            full = ref.get(name)
            if full is None:
                continue
            spec = get_shard_spec(t)
            value = spec.slice_of(full) if spec is not None else full
            if tuple(value.shape) == tuple(t.shape):
                t.copy_(value)


def _reduce_replicated_grads(model: nn.Module, group) -> None:
    """Sum over TP the gradients of ``replicated_param`` parameters that the schedule's own
    gradient hooks (``all_reduce_grads``, ``mark_replicated``) do not reduce already: exactly
    what a training loop calling ``slapo.reduce_replicated_grads`` gets."""
    if _distributed(group):
        reduce_replicated_grads(model, group)


class Verify:
    """Context manager: verify the primitives applied inside the block on exit.

    The model is copied on entry (the original for the comparison), so the block's primitives
    are verified against the state before it. ``options=`` and the keyword arguments are those
    of :func:`verify` (but ``reference``: the copy is the reference), checked here (not at the
    end of the block). Nothing is verified when the block raises, or with ``enable=False``.
    """

    def __init__(self, sch: Schedule, example_inputs: Any, *positional: Any, enable: bool = True,
                 options: Optional[VerifyOptions] = None, **keywords: Any):
        if positional:
            raise VerifyError(
                f"Verify() takes sch and example_inputs positionally, but {len(positional)} "
                "more argument(s) were given (the original Slapo's Verify(sch, example_inputs, "
                "device, eval_mode, enable) took those positionally)", call="Verify",
                hint="pass them by keyword: Verify(sch, example_inputs, eval_mode=..., "
                "enable=...)")
        known = [k for k in VERIFY_KEYWORDS if k != "reference"]  # reference: the copy
        check_keywords(keywords, known, "Verify", fallback_hint=(
            "Verify compares with the copy it takes on entry; call slapo.verify(sch, "
            "example_inputs, reference=...) instead") if "reference" in keywords else None)
        inputs = keywords.pop("inputs", None)
        self.options = make_options(options, keywords, "Verify")
        if enable and self.options.device is not None:  # fail here, not after the block
            check_device(sch, self.options.device,
                         inputs if inputs is not None else example_inputs)
        self.sch = sch
        self.example_inputs = example_inputs
        self.inputs = inputs
        self.enable = enable
        self.report: Optional[VerifyReport] = None

    def __enter__(self) -> "Verify":
        if self.enable:
            try:
                self.snapshot = copy.deepcopy(self.sch.root.mod)
            except Exception as e:
                raise VerifyError(f"cannot copy the model to keep the original ({e})",
                                  call="Verify", hint="call slapo.verify(sch, inputs, "
                                  "reference=<unscheduled model>) after the primitives") from e
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.enable and exc_type is None:
            self.report = verify(self.sch, self.example_inputs, inputs=self.inputs,
                                 reference=self.snapshot, options=self.options)
        return False
