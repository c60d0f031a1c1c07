"""The callables ``sync`` installs: a string collective bound to its arguments, and hooks.

All are module-level classes (not closures) so that scheduled models can be deep-copied and
pickled; the process group object is shared, never copied.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

import torch
import torch.distributed as dist

from ..errors import SyncError
from . import collectives as C

__all__ = ["SyncOp", "PreHook", "PostHook"]


class SyncOp:
    """``x -> collective(x)`` for string op ``op`` in ``mode`` (see :mod:`slapo.sync`).

    ``expect_axis`` (negative) is the activation axis the layout requires; a non-negative
    ``axis`` given by the user is checked against it at run time, when the rank is known.
    """

    def __init__(self, op: str, mode: str, *, axis: Optional[int] = None,
                 tensor_parallel_output_grad: bool = False,
                 group: Optional[dist.ProcessGroup] = None, path: str = "",
                 expect_axis: Optional[int] = None, call: Optional[str] = None,
                 from_axis: Optional[int] = None):
        self.op, self.mode, self.axis, self.call = op, mode, axis, call
        self.from_axis = from_axis  # all_to_all: the partition axis the tensor arrives with
        self.tensor_parallel_output_grad = tensor_parallel_output_grad
        self.group, self.path, self.expect_axis = group, path, expect_axis
        self.__name__ = self.name

    @property
    def name(self) -> str:
        """The collective's name, which says its backward."""
        if self.mode == "bwd_post":
            return "identity_forward_all_reduce_backward"
        return {
            "all_reduce": "all_reduce_forward_identity_backward",
            "all_gather": ("all_gather_forward_reduce_scatter_backward"
                           if self.tensor_parallel_output_grad
                           else "all_gather_forward_split_backward"),
            "reduce_scatter": "reduce_scatter_forward_all_gather_backward",
            "scatter": "split_forward_all_gather_backward",
            "all_to_all": "all_to_all_forward_inverse_all_to_all_backward",
        }[self.op]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise SyncError(f"{self.mode} {self.op} got a {type(x).__name__}, not a tensor",
                            path=self.path, call=self.call,
                            hint="sync a module whose (first) input/output is a tensor, or pass "
                            "a function that handles the structure")
        # the axis the layout constrains: where an all_to_all after a module starts from
        name, axis = (("from_axis", self.from_axis) if self.op == "all_to_all"
                      and self.mode == "fwd_post" else ("axis", self.axis))
        if axis is not None and self.expect_axis is not None and \
                -x.dim() <= axis < x.dim() and axis % x.dim() != self.expect_axis % x.dim():
            raise SyncError(
                f"{self.op} with {name}={axis} on a {x.dim()}-D activation, but the layout "
                f"is partitioned on axis {self.expect_axis % x.dim()}", path=self.path,
                call=self.call, hint=f"use {name}={self.expect_axis}")
        fn = getattr(C, self.name)
        if self.op == "all_reduce" or self.mode == "bwd_post":
            return fn(x, self.group)
        if self.op == "all_to_all":
            return fn(x, self.from_axis, self.axis, self.group)
        return fn(x, self.axis, self.group)

    def __deepcopy__(self, memo: dict) -> "SyncOp":
        new = copy.copy(self)  # the process group is shared, not copied
        memo[id(self)] = new
        return new

    def __repr__(self) -> str:
        axis = "" if self.axis is None else f", axis={self.axis}"
        if self.from_axis is not None:
            axis = f", from_axis={self.from_axis}{axis}"
        return f"SyncOp({self.mode}, {self.name}{axis})"


def _first_tensor_index(values: tuple) -> Optional[int]:
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            return i
    return None


class PreHook:
    """Forward-pre hook (with kwargs): applies ``op`` to the module's first input only, keeping
    every other positional and keyword argument (the reference dropped them). The first input is
    the first positional argument, or else the forward's first parameter passed by keyword."""

    def __init__(self, op: SyncOp, first_param: Optional[str]):
        self.op, self.first_param = op, first_param

    def __call__(self, module: Any, args: tuple, kwargs: dict):
        if args:
            return (self.op(args[0]), *args[1:]), kwargs
        if self.first_param is not None and self.first_param in kwargs:
            return args, {**kwargs, self.first_param: self.op(kwargs[self.first_param])}
        raise SyncError("the module was called without its first input", path=self.op.path,
                        call=self.op.call,
                        hint="pass the input positionally or by its parameter name")


class PostHook:
    """Forward hook: applies ``op`` to the output (or to the first tensor of a tuple/list
    output, keeping the other elements)."""

    def __init__(self, op: SyncOp):
        self.op = op

    def __call__(self, module: Any, args: tuple, output: Any):
        if isinstance(output, torch.Tensor):
            return self.op(output)
        if isinstance(output, (tuple, list)):
            i = _first_tensor_index(tuple(output))
            if i is not None:
                items = list(output)
                items[i] = self.op(items[i])
                return type(output)(items) if isinstance(output, list) else tuple(items)
        raise SyncError(f"cannot apply {self.op.name} to an output of type "
                        f"{type(output).__name__}", path=self.op.path, call=self.op.call,
                        hint="sync a submodule that returns a tensor, or pass a function")
