"""What one simulated training step does on its rank: every kernel's FLOPs and bytes, every
collective, and the peak memory.

:class:`StepRecorder` is a :class:`~torch.utils._python_dispatch.TorchDispatchMode` above fake
tensors. Per ATen op it records the FLOPs (PyTorch's own table,
:data:`torch.utils.flop_counter.flop_registry`), the bytes the kernel reads and writes (its
tensor inputs and outputs, and the mutable arguments of an op that returns nothing:
:func:`_written_in_place`; views move nothing), the dtype and the phase (``forward``,
``backward`` or ``optimizer``); per collective (the ops of
:mod:`torch.distributed._tools.fake_collectives`) its kind, bytes, group size, the global ranks
of its group and the phase. A scalar read back from a fake tensor (``loss.item()``, Adam's step
count) reads as 1 (1.0 for floating point) unless fake mode knows it (a constant, e.g. a size
that a pipeline stage packs into a tensor): the values are meaningless, the shapes are not.

Memory: the recorder keeps the bytes of every storage an op creates while it lives (a weak
reference per storage, freed when Python frees it) and their peak over the step and within each
phase (:attr:`StepRecorder.phase_peak`: the optimizer's temporaries apart from the
activations; what follows the optimizer's step, its new states alive, is ``after``); the
caller adds
what was resident before (parameters, buffers). ``MemTracker`` of ``torch.distributed._tools``
does the same with categories, but scans all live tensors on every op (quadratic: a minute per
step of a 2.7B model), so it is not used. Like it, the recorder follows storage resizes (FSDP2
frees its unsharded parameters that way), counts a DTensor's local shard (the ops DTensor runs
on it, not the op on the global tensor), no allocation for an output on an input's storage (a
view), and, through :meth:`StepRecorder.untracked_bytes`, storages the step used that existed
before it outside the caller's state (DDP's gradient buckets). docs/simulate.md, "FSDP2 and
DTensor".
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Dict, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from end2end.simulate.cost.gpu_model import gemm_shape
from end2end.simulate.cost.records import CollectiveRecord, OpRecord, work_totals  # re-exported

__all__ = ["OpRecord", "CollectiveRecord", "StepRecorder", "work_totals", "rank_local",
           "storage_keys"]


_SCALAR = torch.ops.aten._local_scalar_dense.default

#: ATen ops whose output depends on no input's values (constants, shapes): what an optimizer's
#: lazy state initialisation runs (AdamW's ``zeros_like`` moments, its ``torch.tensor(0.0)``
#: step count, ``lift_fresh``), see :meth:`StepRecorder.leave_out_state_initialisation`
CONSTRUCTORS = frozenset({
    "zeros_like", "ones_like", "full_like", "empty_like", "zeros", "ones", "full", "empty",
    "new_zeros", "new_ones", "new_full", "new_empty", "scalar_tensor", "lift_fresh",
    "lift_fresh_copy"})


def _tensors(tree: Any) -> List[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _nbytes(tensors: List[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _written_in_place(func, args, kwargs) -> List[torch.Tensor]:
    """The tensors an op that returns nothing reads and also writes: the positional arguments
    its schema marks mutable (``Tensor(a!)``). The multi-tensor ops (``_foreach_mul_``,
    ``_foreach_copy_``) and the fused optimizers (``_fused_adamw_``, whose schema marks the
    gradients mutable too: 4 bytes per fp32 parameter more than the kernel writes without a
    grad scaler) return ``()``, so their writes are not among the outputs. An ``out=`` list
    (``split_with_sizes_copy``: keyword-only) is written, not read, and already counted once
    among the arguments; an in-place op that returns its input (``add_``) has it counted as
    its output."""
    schema = func._schema
    if schema.returns:
        return []
    written: List[torch.Tensor] = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write and not arg.kwarg_only:
            written += _tensors(args[i] if i < len(args) else kwargs.get(arg.name))
    return written


def _is_dtensor_type(cls: type) -> bool:
    """Whether ``cls`` is a DTensor: the recorder lets DTensor's own dispatch run first and
    records the ops and collectives it issues on this rank's local shards (what the rank
    computes, moves and allocates) instead of the op on the global, logical tensor."""
    from torch.distributed.tensor import DTensor

    return issubclass(cls, DTensor)


def rank_local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: a DTensor's local shard (an FSDP2 parameter, its gradient
    and Adam states, a tensor-parallel weight), any other tensor itself. A DTensor's own
    ``untyped_storage()`` has the bytes of the whole, global tensor."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def storage_keys(tensors) -> set:
    """The storages this rank holds (:func:`rank_local`) of ``tensors``, as keys."""
    return {rank_local(t).untyped_storage()._cdata for t in tensors
            if isinstance(t, torch.Tensor)}


def _name(func) -> str:
    return func._overloadpacket.__name__


def _kind(func) -> str:
    name = func._overloadpacket.__name__.strip("_")
    for word, kind in (("alltoall", "alltoall"), ("all_to_all", "alltoall"),
                       ("reduce_scatter", "reducescatter"), ("allgather", "allgather"),
                       ("all_gather", "allgather"), ("allreduce", "allreduce"),
                       ("all_reduce", "allreduce"), ("broadcast", "broadcast"),
                       ("send", "p2p"), ("recv", "p2p"), ("barrier", "barrier")):
        if word in name:
            return kind
    return name


def _shadowed(recorder: "StepRecorder", propagate: Any) -> Any:
    """``ShardingPropagator._propagate_tensor_meta_non_cached`` while a step is recorded: the
    original, with the recorder marked as inside DTensor's metadata propagation."""

    @functools.wraps(propagate)
    def shadowed(self, *args, **kwargs):
        recorder.shadow += 1
        try:
            return propagate(self, *args, **kwargs)
        finally:
            recorder.shadow -= 1

    return shadowed


class StepRecorder(TorchDispatchMode):
    """Records ops and collectives (see the module docstring); ``phase`` is set by the caller
    for the optimizer step, and read from autograd for the backward."""

    def __init__(self) -> None:
        super().__init__()
        from torch.distributed._tools.fake_collectives import collective_ops, sync_ops
        from torch.utils.flop_counter import flop_registry

        from end2end.simulate.cost.op_flops import EXTRA_FLOPS

        self.ops: List[OpRecord] = []
        self.collectives: List[CollectiveRecord] = []
        self.phase = "forward"
        self.in_wrapper_step = False  # set by the simulator around a wrapping optimizer's step
        self._flops = {**flop_registry, **EXTRA_FLOPS}
        self._collective_ops = collective_ops - sync_ops
        self.live = 0  # bytes of storages created in the step and still alive
        self.peak = 0
        self.phase_peak: Dict[str, int] = {}  # the peak of ``live`` within each phase
        self.stepped = False  # the optimizer has stepped: later bytes count as ``after``
        self._seen: Dict[int, int] = {}
        # storages the step used but did not create (key -> bytes): parameters, the batch,
        # and what a runtime allocated before the step outside the model's state (DDP's
        # gradient buckets, caches); see :meth:`untracked_bytes`
        self.preexisting: Dict[int, int] = {}
        self.shadow = 0  # > 0 inside DTensor's sharding propagation (see __enter__)
        # the optimizer phase's constructor ops (CONSTRUCTORS): their OpRecord -> the storages
        # they created (see leave_out_state_initialisation)
        self._constructed: Dict[int, List[int]] = {}

    def __enter__(self):
        # FSDP2 frees and re-allocates its unsharded parameters by resizing their storages
        # (``untyped_storage().resize_``), which is no ATen op: follow it as MemTracker does
        self._resize = torch.UntypedStorage.resize_
        recorder = self

        def resize_(storage, size):
            out = recorder._resize(storage, size)
            recorder._resized(storage)
            return out

        torch.UntypedStorage.resize_ = resize_
        # DTensor derives an op's output metadata by running the op once on fake tensors of the
        # GLOBAL shapes (``_propagate_tensor_meta_non_cached``, under the fake mode it finds:
        # the simulation's); those shadow ops reached the recorder as if the rank computed and
        # allocated them (FSDP2's AdamW step counted the unsharded model three times over).
        # They are not the rank's work: pass them by. (The method, not torch 2.13's
        # ``_fake_mode_lock`` around its body, so that torch 2.11 is followed the same way.)
        from torch.distributed.tensor._sharding_prop import ShardingPropagator

        self._propagate = ShardingPropagator._propagate_tensor_meta_non_cached
        ShardingPropagator._propagate_tensor_meta_non_cached = _shadowed(self, self._propagate)
        return super().__enter__()

    def __exit__(self, *exc):
        from torch.distributed.tensor._sharding_prop import ShardingPropagator

        torch.UntypedStorage.resize_ = self._resize
        ShardingPropagator._propagate_tensor_meta_non_cached = self._propagate
        return super().__exit__(*exc)

    def _resized(self, storage) -> None:
        """A storage's new size: live bytes follow it (one that existed before the step is
        counted from its first resize on)."""
        key, size = storage._cdata, storage.nbytes()
        self.preexisting.pop(key, None)
        if key not in self._seen:
            self._seen[key] = 0
            weakref.finalize(storage, self._free, key)
        self.live += size - self._seen[key]
        self._seen[key] = size
        self._new_peak()

    def current_phase(self) -> str:
        if self.phase == "optimizer":
            return self.phase
        return "backward" if torch._C._current_graph_task_id() != -1 else "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.shadow:  # DTensor's metadata propagation on global shapes: no rank's work
            return func(*args, **kwargs)
        if any(_is_dtensor_type(t) for t in types):  # DTensor (TP, FSDP2's sharded
            return NotImplemented  # parameters): record the ops it runs on its local shards
        if func is _SCALAR:  # a known constant (e.g. a size packed into a tensor) reads as
            try:               # itself; a computed value as 1
                return func(*args, **kwargs)
            except Exception:  # noqa: BLE001  (fake tensors: data-dependent output)
                return 1.0 if args[0].dtype.is_floating_point else 1
        out = func(*args, **kwargs)
        if func.namespace == "prim":  # fake tensors' metadata queries (prim.device): no work
            return out
        self._allocate(_tensors(out), _tensors((args, kwargs)))
        if func in self._collective_ops:
            self._collective(func, out, args, kwargs)
        elif func.is_view:
            self.ops.append(OpRecord(0, 0, "", self.current_phase(), name=_name(func),
                                     view=True))
            self._constructor(self.ops[-1], out)  # ``lift_fresh`` (torch.tensor) is a view
        else:
            self._op(func, out, args, kwargs)
        return out

    def _allocate(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor]) -> None:
        # an output on an input's storage (a view, an in-place op) allocates nothing: a
        # parameter's view (``t``, ``view``) would otherwise count its storage a second time
        aliased = set()
        for t in inputs:
            storage = t.untyped_storage()
            aliased.add(storage._cdata)
            if storage._cdata not in self._seen:
                self.preexisting.setdefault(storage._cdata, storage.nbytes())
        for t in outputs:
            storage = t.untyped_storage()
            key = storage._cdata
            if key in self._seen or key in aliased:
                continue
            self.preexisting.pop(key, None)  # a freed one's address, reused in the step
            size = storage.nbytes()
            self._seen[key] = size
            self.live += size
            weakref.finalize(storage, self._free, key)
        self._new_peak()

    def _new_peak(self) -> None:
        """Follow the peak of live bytes, over the step and within the current phase."""
        if self.live > self.peak:
            self.peak = self.live
        phase = self.current_phase()
        if self.stepped and phase == "forward":  # after the optimizer's step, not a forward
            phase = "after"
        if self.live > self.phase_peak.get(phase, -1):
            self.phase_peak[phase] = self.live

    def untracked_bytes(self, known) -> int:
        """Bytes of the storages the step used without creating them, less those of the
        tensors ``known`` (the caller's resident state: parameters, buffers, gradients,
        optimizer states): what else a rank holds through the whole step, e.g. DDP's gradient
        buckets, which the backward fills in place."""
        keys = {rank_local(t).untyped_storage()._cdata for t in known
                if isinstance(t, torch.Tensor)}
        return sum(n for k, n in self.preexisting.items() if k not in keys)

    def _free(self, key: int) -> None:
        self.live -= self._seen.pop(key, 0)

    def _op(self, func, out, args, kwargs) -> None:
        count = self._flops.get(func._overloadpacket)
        flops = int(count(*args, **kwargs, out_val=out)) if count else 0
        inputs, outputs = _tensors((args, kwargs)), _tensors(out)
        moved = _nbytes(inputs) + _nbytes(outputs) + _nbytes(_written_in_place(func, args, kwargs))
        if flops or moved:
            dtype = str((outputs or inputs)[0].dtype).replace("torch.", "") \
                if (outputs or inputs) else "float32"
            name = _name(func)
            record = OpRecord(flops, moved, dtype, self.current_phase(), name=name,
                              shape=gemm_shape(name, args) if flops else ())
            self.ops.append(record)
            self._constructor(record, out)

    def _constructor(self, record: OpRecord, out) -> None:
        """Remember the storages of a constructor op of the optimizer phase (see
        :meth:`leave_out_state_initialisation`)."""
        outputs = _tensors(out)
        if record.phase == "optimizer" and record.name in CONSTRUCTORS and outputs:
            self._constructed[id(record)] = [t.untyped_storage()._cdata for t in outputs]

    def leave_out_state_initialisation(self, new_states) -> int:
        """Remove the optimizer's lazy state initialisation from the recorded ops; the number
        removed. A torch optimizer creates its states in its first step (AdamW: two
        ``zeros_like`` moments and a ``torch.tensor(0.0)`` step count per parameter), which is
        the step recorded here; every later step, the steady state a run measures, starts with
        them. An op of the optimizer phase goes if it is a constructor (:data:`CONSTRUCTORS`:
        its values come from no input) and every storage it created is one of ``new_states``
        (this rank's optimizer states that did not exist before the step). Their bytes stay in
        the memory: the states are held from then on. A state made from data (SGD's momentum,
        ``clone`` of the first gradient) stands for the update that later steps do instead, and
        stays."""
        keys = storage_keys(new_states)
        kept = [op for op in self.ops
                if not (id(op) in self._constructed and set(self._constructed[id(op)]) <= keys)]
        removed = len(self.ops) - len(kept)
        self.ops = kept
        self._constructed.clear()
        return removed

    def _collective(self, func, out, args, kwargs) -> None:
        import torch.distributed as dist
        from torch.distributed._tools.fake_collectives import CollectiveOp

        group = CollectiveOp.get_process_group(func, args)
        size = CollectiveOp.get_comm_tensor_size(func, out, args, kwargs)
        ranks = tuple(dist.get_process_group_ranks(group))
        self.collectives.append(CollectiveRecord(_kind(func), int(size), len(ranks), ranks,
                                                 self.current_phase()))

    def totals(self) -> Dict[str, float]:
        """FLOPs and bytes per phase, collectives' bytes per kind (for the row's JSON)."""
        return work_totals(self.ops, self.collectives)
