"""``sync``: insert a tensor-parallel collective before/after a module (or on its gradient)."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Union

from torch import nn

from ..errors import SyncError
from ..runtime.forward_wrap import base_forward, copy_forward_wrappers
from ..sharding.layout import PARTIAL, REPLICATED, Layout, SyncRecord, current_output, shard_info
from ..sharding.rules import is_hf_conv1d
from ..sharding.sync_ops import PostHook, PreHook, SyncOp
from .module_checks import format_call
from .registry import Primitive, register_primitive

__all__ = ["Sync", "MODES", "OPS"]

MODES = ("fwd_pre", "fwd_post", "bwd_post", "both")
OPS = {
    "fwd_post": ("all_reduce", "all_gather", "reduce_scatter", "scatter", "all_to_all"),
    "fwd_pre": ("all_reduce", "all_gather", "reduce_scatter", "scatter", "all_to_all"),
    "bwd_post": ("all_reduce",),
    "both": ("all_reduce",),
}
_KWARGS = ("axis", "tensor_parallel_output_grad", "from_axis")


def _first_param(mod: nn.Module) -> Optional[str]:
    try:
        params = list(inspect.signature(base_forward(mod)).parameters.values())
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return params[0].name if params and params[0].kind in kinds else None


@register_primitive
class Sync(Primitive):
    name = "sync"

    @staticmethod
    def apply(sch, mode: str, sync_op_or_fn: Union[str, Callable], **kwargs: Any) -> None:
        """Synchronise this module's activations across the tensor-parallel group.

        ``mode``: ``"fwd_post"`` (on the output), ``"fwd_pre"`` (on the first input; the other
        inputs are kept), ``"bwd_post"`` (on the gradient w.r.t. the first input: identity
        forward, all-reduce backward) or ``"both"`` (``all_reduce`` only: ``bwd_post`` then
        ``fwd_post``, i.e. the entry and exit of a tensor-parallel region such as a
        column-then-row MLP). String ops (autograd-aware, :mod:`slapo.sharding.collectives`):
        ``all_reduce``, ``all_gather`` (``axis``; ``tensor_parallel_output_grad`` -- whether
        the gradient arriving at the gathered tensor is a partial sum, so backward must
        reduce-scatter rather than split; default False after a module, True before one),
        ``reduce_scatter`` (``axis``), ``scatter`` (``axis``), ``all_to_all`` (``from_axis``
        -> ``axis``: a tensor partitioned along ``from_axis`` becomes partitioned along
        ``axis`` with one all-to-all, backward the inverse all-to-all; after a sharded module
        ``from_axis`` defaults to its output's partition axis). The original's resharding
        strings (``"RS->SR"``...) are refused with the equivalent call. Axes are activation axes; a
        negative axis is checked at schedule time, a non-negative one at run time. A function is
        registered as a hook: ``fwd_pre`` -> ``fn(mod, args)``, ``fwd_post`` ->
        ``fn(mod, args, output)``, ``bwd_post`` -> full backward hook.

        Layout rules, from the module's shard record (modules without one are not checked):
        a fwd_post reduction needs a *partial* output; ``all_gather`` after a module needs its
        output partitioned on that axis, ``all_to_all`` partitioned on ``from_axis``;
        ``scatter`` needs a replicated output; before a row-parallel module (input
        partitioned) only ``scatter``/``reduce_scatter``/``all_to_all`` to that axis fit,
        before a column-parallel one only ``all_gather``/``all_reduce``; ``bwd_post``
        needs a partial input gradient (column-parallel). A row-parallel Linear/Conv1D with a
        bias is swapped for :class:`slapo.op.linear.LinearWithSync` (same Parameters), so the
        reduction happens before the bias is added once. Several syncs run in call order.

        Raises:
            SyncError: unknown mode, op or keyword; a layout rule is violated (e.g.
                ``all_reduce`` on a partitioned output, ``all_gather`` on a partial one, a
                wrong gather axis); a missing ``axis``; a function for the output of a
                row-parallel module with a bias.
        """
        call = format_call("sync", mode, sync_op_or_fn, **kwargs)

        def error(what: str, hint: str) -> SyncError:
            return SyncError(what, path=sch.path, call=call, module=sch.mod, hint=hint)

        if mode not in MODES:
            raise error(f"unknown mode {mode!r}", f"use one of {', '.join(MODES)}")
        if callable(sync_op_or_fn) and not isinstance(sync_op_or_fn, str):
            return _sync_fn(sch, mode, sync_op_or_fn, kwargs, error)
        if isinstance(sync_op_or_fn, str) and "->" in sync_op_or_fn:
            raise error(*reshard_string_error(mode, sync_op_or_fn))
        if not isinstance(sync_op_or_fn, str) or sync_op_or_fn not in OPS[mode]:
            raise error(f"{sync_op_or_fn!r} is not a {mode} sync op",
                        f"{mode} takes {', '.join(OPS[mode])} or a function")
        unknown = sorted(set(kwargs) - set(_KWARGS))
        if unknown:
            raise error(f"unknown keyword(s) {', '.join(unknown)}",
                        f"sync takes {', '.join(_KWARGS)}")
        if mode == "both":
            _check(sch, "bwd_post", "all_reduce", None, error)
            _check(sch, "fwd_post", "all_reduce", None, error)
            _install(sch, "bwd_post", "all_reduce", None, False, None)
            _install(sch, "fwd_post", "all_reduce", None, False, None)
            return None
        for key in ("axis", "from_axis"):
            value = kwargs.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise error(f"{key} must be an int, got {value!r}", f"e.g. {key}=-1")
        if "from_axis" in kwargs and sync_op_or_fn != "all_to_all":
            raise error(f"from_axis only applies to all_to_all, not {sync_op_or_fn}",
                        "drop from_axis")
        if sync_op_or_fn == "all_to_all":
            expect, axis, from_axis = _check_all_to_all(sch, mode, kwargs.get("axis"),
                                                        kwargs.get("from_axis"), error)
            _install(sch, mode, "all_to_all", axis, False, expect, from_axis)
            return None
        expect, axis = _check(sch, mode, sync_op_or_fn, kwargs.get("axis"), error)
        tpog = kwargs.get("tensor_parallel_output_grad")
        if tpog is None:
            tpog = mode == "fwd_pre"
        _install(sch, mode, sync_op_or_fn, axis, bool(tpog), expect)
        return None


def _check(sch, mode: str, op: str, axis: Optional[int], error):
    """Validate ``op`` in ``mode`` against the layouts; returns ``(expected_axis, axis)``."""
    info = shard_info(sch)
    layout = info.layout if info is not None else None
    needs_axis = op in ("all_gather", "scatter", "reduce_scatter")
    expect: Optional[int] = None
    if mode == "fwd_post" and layout is not None:
        cur = current_output(sch)
        if cur is not None:
            if op in ("all_reduce", "reduce_scatter") and cur != PARTIAL:
                raise error(f"{op} needs a partial-sum output, but the output is {cur}",
                            _fix_for(cur))
            if op == "all_gather":
                if cur.kind != "partition":
                    raise error(f"all_gather needs a partitioned output, but the output is {cur}",
                                _fix_for(cur))
                expect = cur.axis
            if op == "scatter" and cur != REPLICATED:
                raise error(f"scatter needs a replicated output, but the output is {cur}",
                            _fix_for(cur))
    if mode == "fwd_pre" and layout is not None:
        want = layout.input
        if op in ("all_reduce", "all_gather") and want != REPLICATED:
            raise error(f"the module's input must stay {want} (it is row-parallel); {op} would "
                        "make it replicated", "remove this sync, or scatter the input instead")
        if op in ("scatter", "reduce_scatter"):
            if want.kind != "partition":
                raise error(f"the module needs a {want} input (it is column-parallel); {op} "
                            "would partition it", "remove this sync")
            expect = want.axis
    if mode == "bwd_post":
        if layout is not None and not layout.input_grad_partial:
            raise error("the gradient of the module's input is not a partial sum (the module "
                        "is not column-parallel); all-reducing it would scale it",
                        "use bwd_post all_reduce on column-parallel modules only")
        if any(r.mode == "bwd_post" for r in sch.metadata.get("sync", [])):
            raise error("the input gradient is already all-reduced by an earlier bwd_post sync",
                        "sync('bwd_post', ...) once per module")
    if needs_axis:
        if axis is None:
            axis = expect
        if axis is None:
            raise error(f"{op} needs the activation axis", "pass axis=..., e.g. axis=1 for "
                        "the sequence axis of [batch, seq, hidden] activations")
        if expect is not None and axis < 0 and axis != expect:
            raise error(f"{op} along axis {axis}, but the layout is partitioned on axis {expect}",
                        f"use axis={expect}")
    return expect, axis


def _check_all_to_all(sch, mode: str, axis: Optional[int], from_axis: Optional[int], error):
    """Validate an all_to_all (``from_axis`` -> ``axis``); returns ``(expect, axis, from_axis)``
    where ``expect`` is the axis the layout fixes (checked again at run time)."""
    info = shard_info(sch)
    layout = info.layout if info is not None else None
    expect: Optional[int] = None
    if mode == "fwd_post" and layout is not None:
        cur = current_output(sch)
        if cur is not None and cur.kind != "partition":
            raise error(f"all_to_all moves a partitioned tensor to another axis, but the output "
                        f"is {cur}", _fix_for(cur))
        if cur is not None:
            expect = cur.axis
            if from_axis is None:
                from_axis = expect
            elif from_axis < 0 and from_axis != expect:
                raise error(f"all_to_all from axis {from_axis}, but the output is partitioned on "
                            f"axis {expect}", f"use from_axis={expect}")
    if mode == "fwd_pre" and layout is not None:
        want = layout.input
        if want.kind != "partition":
            raise error(f"the module needs a {want} input (it is not row-parallel); all_to_all "
                        "would leave it partitioned", "gather the input with all_gather instead")
        expect = want.axis
        if axis is None:
            axis = expect
        elif axis < 0 and axis != expect:
            raise error(f"all_to_all to axis {axis}, but the module needs its input partitioned "
                        f"on axis {expect}", f"use axis={expect}")
    if axis is None or from_axis is None:
        missing = " and ".join(k for k, v in (("from_axis", from_axis), ("axis", axis))
                               if v is None)
        raise error(f"all_to_all needs {missing}", "pass from_axis=<axis the tensor is "
                    "partitioned on now> and axis=<axis to partition it on>, e.g. from_axis=-1, "
                    "axis=-2 (the original's 'RS->SR')")
    if axis == from_axis:
        raise error(f"all_to_all from axis {from_axis} to the same axis does nothing",
                    "remove this sync")
    return expect, axis, from_axis


# The original's resharding strings over the last two axes ("RS" = replicated on axis -2,
# sharded on axis -1) and the equivalent sync.
_RESHARD = {
    ("RR", "RS"): "'scatter', axis=-1", ("RR", "SR"): "'scatter', axis=-2",
    ("RS", "RR"): "'all_gather', axis=-1", ("SR", "RR"): "'all_gather', axis=-2",
    ("RS", "SR"): "'all_to_all', from_axis=-1, axis=-2",
    ("SR", "RS"): "'all_to_all', from_axis=-2, axis=-1",
}


def reshard_string_error(mode: str, spec: str):
    """``(what, hint)`` for one of the original's ``"XY->ZW"`` resharding strings."""
    src, _, dst = spec.replace(" ", "").partition("->")
    what = (f"resharding strings such as {spec!r} are not sync ops; name the collective (the "
            "layout rules then check it against the module's shard record)")
    if src == dst and src in ("RR", "RS", "SR"):
        return what, f"{spec!r} does nothing: remove this sync"
    if (src, dst) in _RESHARD:
        return what, f"write sync({mode!r}, {_RESHARD[src, dst]})"
    return what, ("the original knew RR, RS and SR of the last two axes; use "
                  "sync(mode, 'scatter' | 'all_gather' | 'all_to_all', axis=...)")


def _fix_for(cur: Layout) -> str:
    if cur == PARTIAL:
        return "sum a partial output with all_reduce (or reduce_scatter)"
    if cur.kind == "partition":
        return f"gather a partitioned output with all_gather(axis={cur.axis})"
    return "the output is already complete on every rank; remove this sync"


def _install(sch, mode: str, op: str, axis: Optional[int], tpog: bool,
             expect: Optional[int], from_axis: Optional[int] = None) -> None:
    axes = {} if from_axis is None else {"from_axis": from_axis}
    call = format_call("sync", mode, op, **axes, **({} if axis is None else {"axis": axis}))
    sync_op = SyncOp(op, mode, axis=axis, tensor_parallel_output_grad=tpog, group=sch.group,
                     path=sch.path, expect_axis=expect, call=call, from_axis=from_axis)
    record = SyncRecord(mode, op, axis, tpog if op == "all_gather" else None,
                        from_axis=from_axis)
    mod = sch.mod
    if mode == "fwd_post" and op in ("all_reduce", "reduce_scatter") and \
            current_output(sch) == PARTIAL and getattr(mod, "bias", None) is not None:
        _sync_before_bias(sch, sync_op, call=call)
    elif mode == "fwd_post":
        mod.register_forward_hook(PostHook(sync_op))
    elif mode == "fwd_pre":
        mod.register_forward_pre_hook(PreHook(sync_op, _first_param(mod)), with_kwargs=True)
    elif type(mod) is nn.Linear or is_hf_conv1d(mod):  # bwd_post, overlapped with dW
        _grad_sync_in_linear(sch)
    else:  # bwd_post: wrap the first input so its gradient is all-reduced
        mod.register_forward_pre_hook(PreHook(sync_op, _first_param(mod)), with_kwargs=True)
    sch.metadata.setdefault("sync", []).append(record)


def _swap(sch, new: nn.Module) -> None:
    """Put ``new`` (the same Parameters in a module with the sync built in) at ``sch``'s path."""
    from ..trace.original import keep_original

    mod = sch.mod
    keep_original(mod, new)  # delayed init initialises it as the Linear it stands for
    sch.replace(new, check_signature=False)
    copy_forward_wrappers(mod, new)


def _grad_sync_in_linear(sch) -> None:
    """Column-parallel Linear/Conv1D: all-reduce the input gradient while the weight gradient
    is computed (:class:`slapo.op.linear.LinearWithGradSync`)."""
    from ..op.linear import LinearWithGradSync

    _swap(sch, LinearWithGradSync.from_module(sch.mod, sch.group))


def _sync_before_bias(sch, sync_op: SyncOp, call: str) -> None:
    """Row-parallel Linear/Conv1D with a bias: reduce the bias-free product, then add the bias."""
    from ..op.linear import LinearWithSync

    mod = sch.mod
    if isinstance(mod, LinearWithSync):
        mod.sync_fn = sync_op
        return
    if not isinstance(mod, nn.Linear) and not is_hf_conv1d(mod):
        raise SyncError("the output is a partial sum and the module adds a bias, which would be "
                        f"counted world_size times; {type(mod).__name__} has no bias-after-"
                        "reduction form", path=sch.path, call=call, module=mod,
                        hint="shard only bias-free modules on their input axis, or replace the "
                        "module by one that adds its bias after a reduction")
    _swap(sch, LinearWithSync.from_module(mod, sync_op))


def _sync_fn(sch, mode: str, fn: Callable, kwargs: dict, error) -> None:
    if kwargs:
        raise error(f"keyword(s) {', '.join(sorted(kwargs))} only apply to string sync ops",
                    "bind them into the function (e.g. functools.partial)")
    if mode == "both":
        raise error("mode 'both' only takes 'all_reduce'", "register the function per mode")
    mod = sch.mod
    if mode == "fwd_post" and current_output(sch) == PARTIAL and \
            getattr(mod, "bias", None) is not None:
        raise error("the output is a partial sum with the bias already added on every rank; a "
                    "function cannot reduce before the bias",
                    "use sync('fwd_post', 'all_reduce') or 'reduce_scatter'")
    if mode == "fwd_pre":
        mod.register_forward_pre_hook(fn)
    elif mode == "fwd_post":
        mod.register_forward_hook(fn)
    else:
        mod.register_full_backward_hook(fn)
    name = getattr(fn, "__name__", type(fn).__name__)
    sch.metadata.setdefault("sync", []).append(SyncRecord(mode, f"<{name}>", user_fn=True))
    return None
