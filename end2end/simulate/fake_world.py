"""One process acting as rank ``r`` of ``N``: PyTorch's ``fake`` process group and fake tensors.

:func:`fake_world` initialises the default process group with the ``fake`` backend
(:class:`torch.testing._internal.distributed.fake_pg.FakeStore`: collectives return at once with
the right shapes and no data) and enters :class:`~torch._subclasses.fake_tensor.FakeTensorMode`
(real constants that a runtime made before, e.g. at import, are converted on use),
so that the driver's own code builds a model of any size and trains it one step without
allocating a byte of its tensors. Two things of torch 2.13 need help, only inside this context:

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
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

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


def _fake_backend_group(original):
    def new_group(*args, **kwargs):
        kwargs.pop("backend", None)
        kwargs.pop("pg_options", None)
        return original(*args, **kwargs)

    return new_group


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


@contextlib.contextmanager
def _patched(obj, name: str, value) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


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
            stack.enter_context(_patched(dist, "new_group", _fake_backend_group(dist.new_group)))
            stack.enter_context(_patched(fake_tensor, "CONSTANT_NUMEL_LIMIT", 64))
            from torch.nn.parallel import distributed as ddp

            stack.enter_context(_patched(ddp, "_verify_param_shape_across_processes",
                                         _same_shapes_everywhere))
            stack.enter_context(_patched(ddp.DistributedDataParallel, "__init__",
                                         _with_fake_allreduce(ddp.DistributedDataParallel
                                                              .__init__)))
            yield stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
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
