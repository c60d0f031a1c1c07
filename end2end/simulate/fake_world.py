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
