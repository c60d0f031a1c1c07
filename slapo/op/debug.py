"""A debugging op: an identity that logs what flows through it, on every rank.

:class:`TensorLog` returns its input unchanged (the very tensor, so outputs and gradients are
untouched) and logs, through the ``logging`` logger ``slapo.debug`` (or ``print`` with
``printer=print``), one line per tensor::

    [rank 1/2] bert.encoder.layer.0:fc1 forward: shape=(2, 8, 32) dtype=float32 mean=0.0132
        std=0.581 min=-1.92 max=2.05 absmax=2.05 norm=16.4 nan=0 inf=0

With ``grad=True`` it also logs the gradient arriving at that point in backward (the output is
then a view of the input, so that only this point's gradient is seen). It is always a leaf for
tracing (it carries a slapo forward wrapper), so it can sit in a module that is traced later.

Put it in a model in one of three ways:

* into a traced graph, after any value: :func:`insert_log` (``insert_log(sch["mlp"],
  sch["mlp"].find("fc1")[0])``), labelled with the traced module's path and the node name;
* by subgraph ``replace``: ``sch.replace(nn.Sequential(nn.GELU(), TensorLog("act")), found)``;
* by whole-module ``replace`` of a module that only passes values on (``nn.Identity``,
  ``nn.Dropout(p=0)``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..errors import OpError
from ..runtime.forward_wrap import install_forward_wrapper

__all__ = ["TensorLog", "tensor_summary", "insert_log", "LOGGER"]

LOGGER = logging.getLogger("slapo.debug")


def _rank() -> str:
    if dist.is_available() and dist.is_initialized():
        return f"rank {dist.get_rank()}/{dist.get_world_size()}"
    return "rank 0/1"


def tensor_summary(t: torch.Tensor) -> str:
    """``shape=... dtype=...`` and, for a non-empty tensor, mean/std/min/max/absmax/norm and
    the count of NaN and Inf elements (computed in float32, without autograd)."""
    head = f"shape={tuple(t.shape)} dtype={str(t.dtype).replace('torch.', '')}"
    if t.numel() == 0 or t.device.type == "meta":
        return head
    with torch.no_grad():
        v = t.detach()
        if not (v.is_floating_point() or v.is_complex()):
            return f"{head} min={v.min().item()} max={v.max().item()}"
        f = v.float()
        stats = dict(mean=f.mean(), std=f.std(unbiased=False), min=f.min(), max=f.max(),
                     absmax=f.abs().max(), norm=f.norm())
        text = " ".join(f"{k}={x.item():.6g}" for k, x in stats.items())
        nan, inf = int(torch.isnan(f).sum()), int(torch.isinf(f).sum())
        return f"{head} {text} nan={nan} inf={inf}"


class _GradLog:
    """Tensor hook: logs the gradient (picklable, unlike a closure)."""

    def __init__(self, op: "TensorLog", index: int):
        self.op, self.index = op, index

    def __call__(self, grad: torch.Tensor) -> None:
        self.op.emit("backward", self.index, grad)


class _Logged:
    """The forward wrapper of :class:`TensorLog` (it makes the module a tracing leaf)."""

    def __call__(self, inner: Callable, *args: Any, **kwargs: Any) -> Any:
        out = inner(*args, **kwargs)
        mod: TensorLog = inner.args[0]  # inner = partial(type(mod).forward, mod)
        return mod.log(out)


class TensorLog(nn.Module):
    """Identity that logs shape, dtype and statistics of its input on every rank.

    Args:
        label: names the point in the logs (:func:`insert_log` uses ``"<path>:<node>"``).
        grad: also log the gradient at this point in backward.
        ranks: log only on these ranks (default: all).
        level: the ``logging`` level of the records.
        printer: a function taking the line (e.g. ``print``) instead of the logger.
    """

    def __init__(self, label: str = "TensorLog", *, grad: bool = False,
                 ranks: Optional[Sequence[int]] = None, level: int = logging.INFO,
                 printer: Optional[Callable[[str], Any]] = None):
        super().__init__()
        if not isinstance(label, str):
            raise OpError(f"label must be a str, got {type(label).__name__}", call="TensorLog",
                          hint="e.g. TensorLog('encoder.layer.0 output')")
        self.label, self.grad, self.level, self.printer = label, grad, level, printer
        self.ranks = None if ranks is None else tuple(ranks)
        install_forward_wrapper(self, "tensor_log", _Logged())

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        """Returns ``x`` (further arguments are accepted and ignored)."""
        return x

    def _enabled(self) -> bool:
        if self.ranks is None:
            return True
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return rank in self.ranks

    def emit(self, phase: str, index: int, t: torch.Tensor) -> None:
        """Log one tensor (``phase`` is ``forward`` or ``backward``)."""
        if not self._enabled():
            return
        item = f"[{index}]" if index >= 0 else ""
        line = f"[{_rank()}] {self.label}{item} {phase}: {tensor_summary(t)}"
        if self.printer is not None:
            self.printer(line)
        else:
            LOGGER.log(self.level, line)

    def log(self, out: Any) -> Any:
        """Log every tensor of ``out`` (a tensor or a tuple/list of them); return ``out``."""
        items = list(out) if isinstance(out, (tuple, list)) else [out]
        single = not isinstance(out, (tuple, list))
        for i, t in enumerate(items):
            if not isinstance(t, torch.Tensor):
                continue
            self.emit("forward", -1 if single else i, t)
            if self.grad and t.requires_grad and torch.is_grad_enabled():
                items[i] = t.view_as(t)
                items[i].register_hook(_GradLog(self, -1 if single else i))
        if single:
            return items[0]
        return type(out)(items) if isinstance(out, list) else tuple(items)

    def extra_repr(self) -> str:
        return f"label={self.label!r}, grad={self.grad}"


def insert_log(sch, after: Any, label: Optional[str] = None, **kwargs: Any) -> TensorLog:
    """Insert a :class:`TensorLog` into a traced graph, after the value of ``after`` (a
    subgraph from ``find``, or the name of a node of ``sch``'s traced module).

    Returns the inserted module (registered on the traced module as ``tensor_log_<i>``).

    Raises:
        OpError: ``sch`` is not traced here, or ``after`` names no node.
    """
    owner = sch.root[after.owner] if hasattr(after, "owner") else sch
    gm = owner.mod
    call = f"insert_log({after!r})"
    if not hasattr(gm, "graph"):
        raise OpError("the module is not traced", path=owner.path, call=call, module=gm,
                      hint=f"call sch[{owner.path!r}].trace(...) first")
    if hasattr(after, "output"):
        node = after.output
    else:
        node = next((n for n in gm.graph.nodes if n.name == after), None)
    if node is None or node.graph is not gm.graph or node.op == "output":
        names = [n.name for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
        raise OpError(f"no value {after!r} in the traced graph", path=owner.path, call=call,
                      module=gm, hint="pass a subgraph from find(...) or one of the node names "
                      + ", ".join(names[:10]))
    i = 0
    while hasattr(gm, f"tensor_log_{i}"):
        i += 1
    name = f"tensor_log_{i}"
    mod = TensorLog(label or f"{owner.path or '<root>'}:{node.name}", **kwargs)
    gm.add_module(name, mod)
    with gm.graph.inserting_after(node):
        new = gm.graph.call_module(name, (node,))
    node.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
    gm.graph.lint()
    gm.recompile()
    return mod
