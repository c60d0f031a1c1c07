"""One process acting as rank ``r`` of ``N``: PyTorch's ``fake`` process group and fake tensors.

:func:`fake_world` initialises the default process group with the ``fake`` backend
(:class:`torch.testing._internal.distributed.fake_pg.FakeStore`: collectives return at once with
the right shapes and no data) and enters :class:`~torch._subclasses.fake_tensor.FakeTensorMode`
(real constants that a runtime made before, e.g. at import, are converted on use),
so that the driver's own code builds a model of any size and trains it one step without
allocating a byte of its tensors. Several things of torch 2.13 need help, only inside this context:

* ``Module.to(dtype)`` swaps fake parameters with ``torch.utils.swap_tensors``, which refuses a
  tensor that fake mode holds a weak reference to; the conversion then falls back to
  ``param.data = new`` (what ``Module._apply`` does for real tensors).
* a pipeline stage receives ints and shapes packed into small tensors
  (:func:`slapo.pipeline.values.pack_value`) and reads them back: fake mode keeps the values of
  tensors made from Python data up to ``CONSTANT_NUMEL_LIMIT`` elements (1 by default; 64
  here, enough for a shape), so they read back as themselves.
* DDP checks at start-up, in C++ on the tensors' data, that all ranks hold the same parameter
  shapes; fake tensors have no data, and the simulated ranks run the same code: skipped. Its
  gradient buckets are all-reduced by a comm hook that calls ``dist.all_reduce`` (recorded as
  any collective), since the fake group's C++ work completes without the tensor DDP expects.
* megatron-core asks for extra ``gloo`` groups (``new_group(backend="gloo")``), which cannot be
  made on a fake world; every group is made with the world's (fake) backend.
* Slapo's data-parallel group for a tensor-parallel one (FSDP2 or ZeRO over the replicas of
  a TP group) learns every rank's TP group by an object all-gather, whose sizes the fake group
  does not deliver (``DataDependentOutputException: aten._local_scalar_dense``); here the
  answer is read from the groups this process created (every rank creates every group).
* a ``DeviceMesh`` (FSDP2, DTensor tensor parallelism: ``init_device_mesh``,
  ``DeviceMesh.from_group``, slicing a mesh) keeps its ranks in a small integer tensor that it
  reads back (``.tolist()``); made under fake mode, that tensor has no data
  (``DataDependentOutputException: aten._local_scalar_dense``). Meshes are rank bookkeeping,
  not training state: they are built on real tensors (fake mode suspended), as in a real run.
* ``aten._grouped_mm`` (transformers' mixture-of-experts layers: Mixtral, Qwen3-MoE) has a meta
  kernel that demands bf16 inputs ("Expected inputs of BF16 type"), while the CPU kernel, which
  a real CPU run uses, takes fp32 too: under fake mode the output's shape and strides come from
  the meta kernel run on bf16 stand-ins of the inputs (all its shape, layout and 16-byte
  alignment checks kept: the stand-ins' strides are scaled to the same bytes), its dtype is
  the inputs' (or ``out_dtype``), as the CPU kernel returns it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Iterator, List

import torch
import torch.distributed as dist

__all__ = ["fake_world"]


def _swap_or_set(original):
    def swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
        try:
            original(t1, t2)
        except RuntimeError:
            if t1 is not t2:
                t1.data = t2

    return swap


def _fake_backend_group(original, created: List[List[int]]):
    """``new_group`` on the world's (fake) backend, recording each group's ranks in
    ``created`` (every rank creates every group, in the same order, member or not)."""
    def new_group(*args, **kwargs):
        kwargs.pop("backend", None)
        kwargs.pop("pg_options", None)
        ranks = kwargs.get("ranks", args[0] if args else None)
        created.append(sorted(ranks) if ranks is not None else
                       list(range(dist.get_world_size())))
        return original(*args, **kwargs)

    return new_group


def _layouts_of_created_groups(created: List[List[int]]):
    """A stand-in for :func:`slapo.dialects.common.tensor_parallel_layouts`, whose object
    all-gather has no data on a fake group: every rank's group, read from the groups this
    process created (``created``): the run of consecutive groups of ``mine``'s size, ``mine``
    among them, that together hold every rank once (what ``new_subgroups`` and a loop of
    ``new_group`` calls make)."""
    def layouts(mine: List[int]) -> List[List[int]]:
        world, mine = dist.get_world_size(), sorted(mine)
        if mine == list(range(world)):
            return [mine] * world
        count = world // len(mine)
        for at in (i for i, g in enumerate(created) if g == mine):
            for start in range(max(0, at - count + 1), at + 1):
                window = created[start:start + count]
                if sorted(r for g in window for r in g) == list(range(world)):
                    owner = {r: g for g in window for r in g}
                    return [owner[r] for r in range(world)]
        raise RuntimeError(
            f"simulation: cannot tell the other ranks' tensor-parallel groups from rank "
            f"{dist.get_rank()}'s {mine}: no run of groups of its size created here covers the "
            f"{world} ranks once (create the groups with dist.new_subgroups or one new_group "
            f"call per block, on every rank)")

    return layouts


def _same_shapes_everywhere(process_group, tensors, logger=None) -> None:
    """DDP's start-up check that every rank has the same parameter shapes reads the tensors'
    data in C++ (fake tensors have none); the ranks of a simulation are the same code by
    construction."""


def _fake_allreduce_hook(state, bucket):
    """DDP's gradient bucket all-reduce as a Python collective: the fake group's own C++ work
    completes with no tensor, which DDP's reducer refuses."""
    buffer = bucket.buffer()
    dist.all_reduce(buffer)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


def _with_fake_allreduce(original):
    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.register_comm_hook(None, _fake_allreduce_hook)

    return init


def _outside_fake_mode(original):
    def call(*args, **kwargs):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return original(*args, **kwargs)

    return functools.wraps(original)(call)


_MESH_METHODS = ("__init__", "from_group", "__getitem__", "_flatten", "_unflatten",
                 "_concatenate")


def _real_device_meshes(stack: contextlib.ExitStack) -> None:
    """Build every ``DeviceMesh`` on real tensors (see the module docstring)."""
    import inspect

    from torch.distributed import device_mesh

    mesh_cls = device_mesh.DeviceMesh
    for name in _MESH_METHODS:
        raw = inspect.getattr_static(mesh_cls, name, None)
        if isinstance(raw, staticmethod):
            stack.enter_context(_class_attribute(
                mesh_cls, name, staticmethod(_outside_fake_mode(raw.__func__))))
        elif raw is not None:
            stack.enter_context(_class_attribute(mesh_cls, name, _outside_fake_mode(raw)))
    init = _outside_fake_mode(device_mesh.init_device_mesh)
    stack.enter_context(_patched(device_mesh, "init_device_mesh", init))
    if hasattr(dist, "init_device_mesh"):
        stack.enter_context(_patched(dist, "init_device_mesh", init))


def _grouped_mm_any_dtype(fake_mode, func, *args, **kwargs):
    """``aten._grouped_mm`` under fake tensors for the inputs' dtype (module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensor

    names = ("self", "mat2", "offs", "bias", "out_dtype")
    given = dict(zip(names, args), **kwargs)
    a, b = given["self"], given["mat2"]
    if a.dtype != b.dtype:
        raise RuntimeError(f"_grouped_mm: mat_a is {a.dtype} and mat_b {b.dtype}; "
                           "the CPU kernel needs one dtype")

    def meta(t, dtype=None):  # strides other than 1 scaled: the same 16-byte alignment
        if t is None:
            return None
        scale = t.element_size() // torch.empty((), dtype=dtype or t.dtype).element_size()
        stride = [s if s == 1 else s * scale for s in t.stride()]
        return torch.empty_strided(t.shape, stride, dtype=dtype or t.dtype, device="meta")

    shape = func(meta(a, torch.bfloat16), meta(b, torch.bfloat16), meta(given.get("offs")),
                 meta(given.get("bias"), torch.bfloat16), None)
    out = torch.empty_strided(shape.shape, shape.stride(),
                              dtype=given.get("out_dtype") or a.dtype, device="meta")
    return FakeTensor(fake_mode, out, a.device)


@contextlib.contextmanager
def _class_attribute(cls: type, name: str, value) -> Iterator[None]:
    """``cls.name = value`` for the context; restores the class's own attribute as it was
    (a ``staticmethod`` stays one), or removes it if it was inherited."""
    missing = object()
    old = cls.__dict__.get(name, missing)
    setattr(cls, name, value)
    try:
        yield
    finally:
        if old is missing:
            delattr(cls, name)
        else:
            setattr(cls, name, old)


@contextlib.contextmanager
def _dict_entry(table: dict, key, value) -> Iterator[None]:
    """``table[key] = value`` for the context (restored or removed after)."""
    missing = object()
    old = table.get(key, missing)
    table[key] = value
    try:
        yield
    finally:
        if old is missing:
            table.pop(key, None)
        else:
            table[key] = old


@contextlib.contextmanager
def _patched(obj, name: str, value) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _copies_share_the_mode(mode) -> None:
    """``copy.deepcopy`` of a fake tensor (a schedule's history snapshots the modules given to
    a primitive; verification and ``create_schedule`` copy models) copies the tensor's
    ``__dict__``, which holds its ``fake_mode``. A copied mode duplicates the ``StorageWeakRef``
    handles its tensor converter keeps, and every copy frees its handle when collected: a double
    free that corrupted glibc's heap in about one of ten simulations of a Slapo-scheduled
    ``tiny/bert`` (a segfault or "corrupted double-linked list" in a later, unrelated
    allocation; seen under valgrind as ``THPStorage_freeWeakRef`` reading a block it freed). The
    copies share the one mode instead, as torch's ``FakeCopyMode`` makes them do."""
    mode.__deepcopy__ = lambda memo: mode


@contextlib.contextmanager
def fake_world(rank: int, world_size: int) -> Iterator[torch._subclasses.FakeTensorMode]:
    """Rank ``rank`` of a fake ``world_size``-rank job under fake tensors (yields the mode).

    The default process group is destroyed on exit; megatron/DeepSpeed state is left to
    :func:`slapo.runtime.distributed.teardown`, which the caller runs.
    """
    from torch._subclasses import fake_tensor
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("fake_world needs a process without a default process group")
    env = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_patched(torch.utils, "swap_tensors",
                                         _swap_or_set(torch.utils.swap_tensors)))
            from torch.distributed import distributed_c10d

            from slapo.dialects import common as slapo_common

            created: List[List[int]] = []
            new_group = _fake_backend_group(distributed_c10d.new_group, created)
            stack.enter_context(_patched(dist, "new_group", new_group))
            stack.enter_context(_patched(distributed_c10d, "new_group", new_group))
            stack.enter_context(_patched(slapo_common, "tensor_parallel_layouts",
                                         _layouts_of_created_groups(created)))
            stack.enter_context(_patched(fake_tensor, "CONSTANT_NUMEL_LIMIT", 64))
            from torch.nn.parallel import distributed as ddp

            stack.enter_context(_patched(ddp, "_verify_param_shape_across_processes",
                                         _same_shapes_everywhere))
            stack.enter_context(_patched(ddp.DistributedDataParallel, "__init__",
                                         _with_fake_allreduce(ddp.DistributedDataParallel
                                                              .__init__)))
            _real_device_meshes(stack)
            from torch._subclasses import fake_impls

            stack.enter_context(_dict_entry(fake_impls.op_implementations_dict,
                                            torch.ops.aten._grouped_mm.default,
                                            _grouped_mm_any_dtype))
            mode = stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
            _copies_share_the_mode(mode)
            yield mode
    finally:
        from slapo.runtime.distributed import teardown

        teardown()
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
