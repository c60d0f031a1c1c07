"""Building blocks of numerical verification: the report, tolerances, tensor comparison,
gathering shards, original parameters held under other names (:class:`DerivedParams`), and
recording every module's output to find the first divergence."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from ..provenance import Source, derived_parameters
from ..sharding.layout import LayoutProblem
from ..sharding.spec import get_shard_spec

__all__ = [
    "VerifyReport",
    "DerivedParams",
    "default_tolerances",
    "Difference",
    "compare",
    "gather_chunks",
    "to_full",
    "OutputRecorder",
    "OutputComparer",
    "first_difference",
    "first_tensor",
]

_TOLERANCES = {
    torch.float64: (1e-9, 1e-10),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
}


def default_tolerances(dtype: torch.dtype) -> Tuple[float, float]:
    """``(rtol, atol)`` for comparing a scheduled model against the original in ``dtype``.

    Looser than ``torch.testing`` defaults for fp32: tensor parallelism reorders reductions.
    """
    return _TOLERANCES.get(dtype, (1e-4, 1e-5))


@dataclasses.dataclass
class Difference:
    """How two tensors differ: max absolute error, max relative error, and whether within
    tolerance (``|a - b| <= atol + rtol * |b|`` elementwise)."""

    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""

    def __str__(self) -> str:
        if self.note:
            return self.note
        return f"max abs {self.max_abs:.2e}, max rel {self.max_rel:.2e}"


@dataclasses.dataclass
class VerifyReport:
    """What ``verify`` compared and what differed (on this rank)."""

    rank: int = 0
    outputs: Dict[str, Difference] = dataclasses.field(default_factory=dict)
    grads: Dict[str, Difference] = dataclasses.field(default_factory=dict)
    params_after_step: Dict[str, Difference] = dataclasses.field(default_factory=dict)
    first_divergence: Optional[Tuple[str, Difference]] = None
    first_grad_divergence: Optional[Tuple[str, Difference]] = None
    error: Optional[Tuple[str, str]] = None  # (module path, exception) raised by the schedule
    problems: List[LayoutProblem] = dataclasses.field(default_factory=list)
    unmatched: List[str] = dataclasses.field(default_factory=list)
    derived: Dict[str, str] = dataclasses.field(default_factory=dict)
    derived_values: Dict[str, Difference] = dataclasses.field(default_factory=dict)
    ok: bool = True

    def _named(self, name: str) -> str:
        via = self.derived.get(name)
        return f"'{name}'" + (f" (held as {via})" if via else "")

    def failures(self) -> List[str]:
        out = [f"rule: {p}" for p in self.problems]
        if self.error is not None:
            out.append(f"the scheduled model raised in '{self.error[0]}': {self.error[1]}")
        out += [f"output '{k}' differs ({d})" for k, d in self.outputs.items() if not d.ok]
        bad = [(k, d) for k, d in self.derived_values.items() if not d.ok]
        if bad:
            shown = "; ".join(f"{self._named(k)}: {d}" for k, d in bad[:4])
            out.append(f"values of {len(bad)} renamed parameter(s) differ from the original's "
                       f"(before the run): {shown}" + (" ..." if len(bad) > 4 else ""))
        bad = [(k, d) for k, d in self.grads.items() if not d.ok]
        if bad:
            shown = "; ".join(f"{self._named(k)} ({d})" for k, d in bad[:4])
            out.append(f"gradients of {len(bad)} parameter(s) differ: {shown}"
                       + (" ..." if len(bad) > 4 else ""))
        bad = [(k, d) for k, d in self.params_after_step.items() if not d.ok]
        if bad:
            out.append(f"{len(bad)} parameter(s) differ after optimizer steps, first "
                       f"{self._named(bad[0][0])} ({bad[0][1]})")
        return out

    def __str__(self) -> str:
        head = f"rank {self.rank}: " + ("verification passed" if self.ok else "verification failed")
        lines = [head, f"  compared {len(self.outputs)} outputs, {len(self.grads)} gradients, "
                       f"{len(self.params_after_step)} parameters after steps"]
        if self.derived:
            lines.append(f"  ({len(self.derived)} original parameters renamed or re-laid by the "
                         "schedule compared through their provenance records)")
        lines += [f"  {f}" for f in self.failures()]
        if self.first_divergence is not None:
            path, d = self.first_divergence
            lines.append(f"  first divergence at '{path}' ({d})")
        if self.first_grad_divergence is not None:
            path, d = self.first_grad_divergence
            lines.append(f"  first divergence in backward: gradient of the output of '{path}' "
                         f"({d})")
        if self.unmatched:
            lines.append(f"  not compared (no parameter of that name, nor a provenance record, "
                         f"after scheduling): "
                         f"{', '.join(self.unmatched[:6])}" + (" ..." if len(self.unmatched) > 6
                                                               else ""))
        return "\n".join(lines)


_CHUNK = 1 << 20  # elements compared at a time: float64 copies of whole outputs (an LM's
#                  logits) would need several times the output's own memory


def compare(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> Difference:
    """Compare two tensors (shapes must agree; a shape mismatch is a difference).

    Computed in float64, a chunk of elements at a time, so the temporary copies stay small
    whatever the tensors' size."""
    if tuple(actual.shape) != tuple(expected.shape):
        return Difference(float("inf"), float("inf"), False,
                          f"shape {list(actual.shape)} instead of {list(expected.shape)}")
    a_all = actual.detach().reshape(-1)
    b_all = expected.detach().reshape(-1)
    max_abs = max_rel = 0.0
    ok = True
    for start in range(0, a_all.numel(), _CHUNK):
        a = a_all[start:start + _CHUNK].to(torch.float64)
        b = b_all[start:start + _CHUNK].to(device=a.device, dtype=torch.float64)
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            if not torch.equal(torch.isnan(a), torch.isnan(b)):
                return Difference(float("nan"), float("nan"), False,
                                  "NaN/inf in different places")
            finite = torch.isfinite(a) & torch.isfinite(b)
            a, b = a[finite], b[finite]
            if a.numel() == 0:
                continue
        diff = (a - b).abs()
        scale = b.abs()
        max_abs = max(max_abs, diff.max().item())
        max_rel = max(max_rel, (diff / scale.clamp_min(1e-12)).max().item())
        ok = ok and bool((diff <= atol + rtol * scale).all())
    return Difference(max_abs, max_rel, ok)


class DerivedParams:
    """Original parameters that the scheduled model holds under other names or in another
    layout, rebuilt from the provenance records of its modules (:mod:`slapo.provenance`).

    Only names of ``reference_names`` that the scheduled model lacks are taken (a same-named
    parameter always wins). :meth:`rebuild` gathers the full tensors of the new parameters
    (each once) and applies the records; every rank must make the same calls.
    """

    def __init__(self, model: nn.Module, reference_names, params: Dict[str, torch.Tensor]):
        names = set(reference_names)
        self.params = params
        self.sources: Dict[str, Source] = {
            n: s for n, s in sorted(derived_parameters(model).items())
            if n in names and n not in params}

    def held_as(self) -> Dict[str, str]:
        """``{original name: "new name(s)"}`` for the report."""
        return {n: ", ".join(f"'{p}'" for p in s.params) for n, s in self.sources.items()}

    def rebuild(self, group: Optional[dist.ProcessGroup],
                grad: bool) -> Dict[str, Optional[torch.Tensor]]:
        """``{original name: tensor in the original layout}`` of the current values (or, with
        ``grad``, gradients; ``None`` when a new parameter has no gradient)."""
        full: Dict[str, Optional[torch.Tensor]] = {}
        for name in sorted({p for s in self.sources.values() for p in s.params}):
            q = self.params[name]
            t = q.grad if grad else q.data
            full[name] = None if t is None else to_full(t.detach(), group, t, param=q)
        out: Dict[str, Optional[torch.Tensor]] = {}
        for name, src in self.sources.items():
            tensors = [full[p] for p in src.params]
            out[name] = None if any(t is None for t in tensors) else src(*tensors)
        return out


def gather_chunks(local: torch.Tensor, group: Optional[dist.ProcessGroup]) -> List[torch.Tensor]:
    """Every rank's equal-shaped ``local`` tensor, in rank order."""
    world = dist.get_world_size(group)
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local.detach().contiguous(), group=group)
    return parts


def to_full(t: torch.Tensor, group: Optional[dist.ProcessGroup], like: torch.Tensor,
            param: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The full (unsharded) version of ``t``, a parameter's value or gradient, or an activation.

    Uses the parameter's ``ShardSpec`` when it has one (``spec.join``, so fused q/k/v shards
    reassemble correctly); otherwise, when ``t``'s shape differs from the reference ``like`` in
    exactly one dimension by the group size, gathers along it (an activation partitioned by
    tensor parallelism). Otherwise ``t`` is returned as is. Every rank must make the same calls.
    """
    spec = get_shard_spec(param if param is not None else t)
    distributed = dist.is_available() and dist.is_initialized()
    if spec is not None and spec.world_size > 1:
        return spec.join(gather_chunks(t, group)) if distributed else t
    if not distributed or tuple(t.shape) == tuple(like.shape) or t.dim() != like.dim():
        return t
    world = dist.get_world_size(group)
    axes = [i for i, (a, b) in enumerate(zip(t.shape, like.shape)) if a != b]
    if len(axes) == 1 and t.shape[axes[0]] * world == like.shape[axes[0]]:
        return torch.cat(gather_chunks(t, group), dim=axes[0])
    return t


def first_tensor(value: Any) -> Optional[torch.Tensor]:
    """The first tensor in a (nested) module output, or None."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for v in value:
            t = first_tensor(v)
            if t is not None:
                return t
    return None


class OutputRecorder:
    """Records, for every module call, the first tensor of its output (forward) and of the
    gradient w.r.t. its output (backward), keyed by ``(path, call index)`` in finishing order.

    Forward hooks finish children before parents, so the first differing forward record is the
    innermost module where the outputs start to differ; backward records arrive in backward
    order, so the first differing one is the module closest to the loss whose output gradient is
    wrong. ``active`` is the stack of modules currently running; after an exception it still
    holds the modules the exception passed through, innermost last. With ``keep=False`` only
    ``active`` is tracked (nothing is recorded or held).
    """

    def __init__(self, model: nn.Module, keep: bool = True):
        self.records: List[Tuple[str, int, torch.Tensor]] = []
        self.grad_records: List[Tuple[str, int, torch.Tensor]] = []
        self.active: List[str] = []
        self.keep = keep
        self._calls: Dict[str, int] = {}
        self._handles = []
        for path, mod in model.named_modules(remove_duplicate=False):
            path = path or "<root>"
            self._handles += [
                mod.register_forward_pre_hook(self._enter(path)),
                mod.register_forward_hook(self._exit(path)),
            ]

    def _enter(self, path: str):
        def hook(mod, args):
            self.active.append(path)

        return hook

    def _exit(self, path: str):
        def hook(mod, args, out):
            if self.active and self.active[-1] == path:
                self.active.pop()
            t = first_tensor(out)
            if t is None or not self.keep:
                return
            n = self._calls.get(path, 0)
            self._calls[path] = n + 1
            self.record(self.records, path, n, t)
            if t.requires_grad:
                # A tensor hook (not a module backward hook): it does not wrap the output, so
                # in-place ops on it later (e.g. ReLU(inplace=True)) stay legal.
                t.register_hook(self._grad(path, n))

        return hook

    def _grad(self, path: str, n: int):
        def hook(grad: torch.Tensor) -> None:
            self.record(self.grad_records, path, n, grad)

        return hook

    def record(self, records: list, path: str, n: int, t: torch.Tensor) -> None:
        records.append((path, n, t.detach().clone()))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


class OutputComparer(OutputRecorder):
    """An :class:`OutputRecorder` of the scheduled model that compares each record with the
    reference's as it is produced and keeps only the first difference (forward and backward),
    so one model's records are held, not two. Every rank must run the same module calls."""

    def __init__(self, model: nn.Module, reference: OutputRecorder, group, rtol: float,
                 atol: float):
        super().__init__(model)
        self.reference = reference
        self.group, self.tol = group, (rtol, atol)
        self._expected: Dict[int, Dict[Tuple[str, int], torch.Tensor]] = {}
        self.first: Dict[int, Optional[Tuple[str, Difference]]] = {}

    def _take_expected(self, records: list, path: str, n: int) -> Optional[torch.Tensor]:
        """The reference's record of this call, handed over (and released once compared): the
        reference's forward (backward) has finished before the scheduled model's starts."""
        key = id(records)
        if key not in self._expected:
            ref = (self.reference.records if records is self.records
                   else self.reference.grad_records)
            self._expected[key] = {(p, i): e for p, i, e in ref}
            ref.clear()
        return self._expected[key].pop((path, n), None)

    def record(self, records: list, path: str, n: int, t: torch.Tensor) -> None:
        expected = self._take_expected(records, path, n)
        if expected is None:
            return
        diff = compare(to_full(t.detach(), self.group, like=expected), expected, *self.tol)
        key = id(records)
        if self.first.get(key) is None and not diff.ok:
            self.first[key] = (path, diff)

    @property
    def first_divergence(self) -> Optional[Tuple[str, Difference]]:
        return self.first.get(id(self.records))

    @property
    def first_grad_divergence(self) -> Optional[Tuple[str, Difference]]:
        return self.first.get(id(self.grad_records))


def first_difference(ref: List[Tuple[str, int, torch.Tensor]],
                     mine: List[Tuple[str, int, torch.Tensor]], group, rtol: float,
                     atol: float) -> Optional[Tuple[str, Difference]]:
    """The first record of ``mine`` (in its order) that differs from ``ref``'s record of the same
    module call. Every rank makes the same sequence of gathers, then decides locally."""
    expected_by_key = {(p, n): t for p, n, t in ref}
    first = None
    for path, n, t in mine:
        expected = expected_by_key.get((path, n))
        if expected is None:
            continue
        diff = compare(to_full(t, group, like=expected), expected, rtol, atol)
        if first is None and not diff.ok:
            first = (path, diff)
    return first
