"""Megatron-LM's mixed precision for the ``megatron`` and ``slapo-megatron`` modes.

In bf16/fp16 Megatron-LM trains the model cast to the dtype and keeps the rest in fp32 inside
its optimizer: megatron-core's ``Float16OptimizerWithFloat16Params`` holds an fp32 master copy
of every parameter, copies the model's gradients into fp32 master gradients, runs the torch
optimizer (its moments fp32, as the masters) and copies the masters back into the model. In
fp16 it also scales the loss with a ``DynamicGradScaler`` (Megatron-LM's defaults: initial scale
2^32, halved after ``hysteresis`` = 2 overflowing steps in a row, doubled after 1000 clean
ones, never below 1) and skips a step whose gradients hold an inf/nan; bf16 has no scaler.
:func:`mixed_precision_optimizer` builds exactly what ``get_megatron_optimizer`` builds for a
non-distributed optimizer (``Float16OptimizerWithFloat16Params`` over the mode's torch
optimizer, the scaler above for fp16, the model-parallel group for the overflow vote), so both
megatron modes hold ~16 bytes per parameter (2 model + 4 master + 8 moments + transient 2 + 4
gradients) as the paper's Megatron-LM runs did, instead of the cast model's 8. The one
difference: ``clip_grad`` = 0 (Megatron-LM clips at 1.0), as every mode of this driver trains
without clipping. The loss scale reaches the backward through megatron's own
``config.grad_scale_func`` (set by :class:`slapo.dialects.megatron.MegatronRuntime` from the
optimizer's ``scale_loss``); gradients are all-reduced over data-parallel ranks before the step,
in the model's dtype, as in fp32 runs.

Three pieces of megatron-core are bridged here, not rewritten:

* the optimizer and its scaler create their flags and scales with ``device="cuda"`` and accept
  only parameters whose ``param.type()`` is ``torch.cuda.HalfTensor`` / ``BFloat16Tensor``;
  on a CPU they are built under :class:`_CpuAsCuda` (a ``TorchFunctionMode`` active only while
  they are constructed) that creates those tensors on the CPU and reports CPU parameters'
  types with their CUDA names; everything afterwards runs megatron-core's code unchanged
  (``torch._amp_foreach_non_finite_check_and_unscale_`` has a CPU kernel) except the two
  overrides below.
* fp16 copies the masters into the model through megatron's ``multi_tensor_applier`` (with
  Apex/TransformerEngine one multi-tensor kernel family, without them a multiply by 1.0 per
  tensor); the override copies them with torch's own multi-tensor copy, bf16 one tensor at a
  time as megatron's bf16 path does
  (:meth:`MegatronMixedPrecisionOptimizer._copy_main_params_to_model_params`).
* the overflow vote reads ``found_inf.item()``; on fake tensors (the simulator,
  :mod:`end2end.simulate`) that value does not exist and reads as 1, which would skip every
  simulated step: :class:`MegatronMixedPrecisionOptimizer` runs the same unscale and all-reduce
  there but takes the step (a steady step, whose optimizer states are what a run holds).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, List, Optional

import torch
import torch.distributed as dist
from megatron.core.optimizer.grad_scaler import DynamicGradScaler
from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params
from torch.overrides import TorchFunctionMode

from slapo.errors import ConfigError

__all__ = ["MegatronMixedPrecisionOptimizer", "mixed_precision_optimizer",
           "megatron_optimizer_factory", "master_parameters"]

OptimizerFactory = Callable[[Any], torch.optim.Optimizer]
_LOW = (torch.float16, torch.bfloat16)


class _CpuAsCuda(TorchFunctionMode):
    """While active: ``device="cuda"`` in a call becomes ``device``, and ``Tensor.type()``
    names a CPU tensor's type as its CUDA counterpart (``torch.cuda.BFloat16Tensor``)."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if name.startswith("torch.cuda.") else "torch.cuda." + name[6:]
        device = kwargs.get("device")
        if device is not None and str(device).startswith("cuda"):
            kwargs["device"] = self.device
        return func(*args, **kwargs)


class MegatronMixedPrecisionOptimizer(Float16OptimizerWithFloat16Params):
    """megatron-core's ``Float16OptimizerWithFloat16Params`` (see the module docstring); on
    fake tensors an overflow cannot be read and the step is taken."""

    def _unscale_main_grads_and_check_for_nan(self) -> bool:
        from torch._subclasses.fake_tensor import is_fake

        if not is_fake(self.found_inf):
            return super()._unscale_main_grads_and_check_for_nan()
        self.found_inf.fill_(0.0)
        torch._amp_foreach_non_finite_check_and_unscale_(
            self._collect_main_grad_data_for_unscaling(), self.found_inf,
            self.grad_scaler.inv_scale)
        dist.all_reduce(self.found_inf, op=dist.ReduceOp.MAX,
                        group=self.get_grad_stats_parallel_group())
        return False

    def use_fused_step(self) -> bool:
        """Step the masters with torch's fused multi-tensor kernel (``fused=True``: one kernel
        family, no temporaries) where the inner torch optimizer was left to choose its form:
        Megatron-LM steps them with Apex's/TransformerEngine's FusedAdam and apex's O2 with its
        fused optimizers, where torch's default on CUDA, ``foreach``, makes a temporary of the
        second moments' square roots over every master at once (+4 bytes per parameter at the
        step's peak). :func:`mixed_precision_optimizer` calls it on CUDA, the simulator on a
        GPU profile (:func:`end2end.simulate.engine.step.multi_tensor_optimizer`). True if the
        inner optimizer has a fused form (Adam, AdamW, SGD, Adagrad) and was switched."""
        inner = self.optimizer
        if "fused" not in getattr(inner, "defaults", {}):
            return False
        switched = False
        for group in inner.param_groups:
            if not group.get("fused") and group.get("foreach") is None \
                    and not group.get("differentiable"):
                group["fused"] = switched = True
        return switched

    def _copy_main_params_to_model_params(self) -> None:
        """Masters into the model. fp16: one ``torch._foreach_copy_`` over every tensor, as
        Megatron-LM copies them with Apex's/TransformerEngine's ``multi_tensor_scale`` by 1.0
        (and apex's O2 the same way); megatron's fallback without those libraries multiplies
        each master by 1.0 first (``local_multi_tensor_scale``), the same values through an fp32
        temporary per tensor that fake tensors keep alive to the end of the step (+5 GB per
        rank for LLaMA-7B at TP 8 in the simulator). bf16: one ``copy_`` per tensor, megatron's
        own bf16 path."""
        models, mains = self._get_model_and_main_params_data_float16()
        if self._dummy_overflow_buf is not None:  # fp16: megatron's multi-tensor path
            torch._foreach_copy_(models, mains)
            return
        for model, main in zip(models, mains):
            model.copy_(main)


def _check_params(params: List[torch.nn.Parameter], dtype: torch.dtype) -> None:
    odd = sorted({str(p.dtype) for p in params if p.dtype != dtype})
    if odd:
        raise ConfigError(f"megatron mixed precision in {dtype}: the model also has "
                          f"{', '.join(odd)} parameters", call="mixed_precision_optimizer",
                          hint=f"cast the whole model to {dtype} before making the optimizer "
                          "(model.to(dtype)); megatron-core keeps the fp32 masters itself")


def mixed_precision_optimizer(params: Iterable[torch.nn.Parameter], dtype: torch.dtype,
                              base: OptimizerFactory, *, initial_loss_scale: float = 2.0 ** 16,
                              hysteresis: int = 2,
                              device: Optional[torch.device] = None,
                              vote_group: Any = "megatron"
                              ) -> MegatronMixedPrecisionOptimizer:
    """megatron-core's mixed-precision optimizer over ``params`` (all of ``dtype``, fp16 or
    bf16): ``base(params)`` (the mode's torch optimizer) made over them, its parameters then
    replaced by fp32 masters; fp16 gets a ``DynamicGradScaler`` (``initial_loss_scale``,
    ``hysteresis``; Megatron-LM's other defaults), bf16 none. The initial scale is 2^16,
    DeepSpeed's default (``initial_scale_power`` 16), not Megatron-LM's 2^32: from 2^32 the
    first ~17 fp16 steps overflow and skip the optimizer (seen on a tiny GPT), which in a
    benchmark of 40 steps would make the megatron modes' steps look cheaper than DeepSpeed's.
    ``vote_group``: the ranks whose gradients hold different parts of the model, which vote on
    an overflow (``"megatron"``, the default: megatron's model-parallel group, so its parallel
    state must be initialised; ``None``: the default group, e.g. a plain-PyTorch TP run over
    the world or data-parallel replicas that hold the same gradients). ``device``: where the
    flags live (default: the parameters' device). On CUDA the masters are stepped fused
    (:meth:`MegatronMixedPrecisionOptimizer.use_fused_step`).

    Raises:
        ConfigError: ``dtype`` is not fp16/bf16, or a parameter is of another dtype.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.optimizer.optimizer_config import OptimizerConfig

    if dtype not in _LOW:
        raise ConfigError(f"megatron mixed precision needs torch.float16 or torch.bfloat16, got "
                          f"{dtype}", call="mixed_precision_optimizer",
                          hint="fp32 runs use the torch optimizer as it is")
    params = [p for p in params if p.requires_grad]
    _check_params(params, dtype)
    fp16 = dtype == torch.float16
    config = OptimizerConfig(fp16=fp16, bf16=not fp16, params_dtype=dtype, clip_grad=0.0,
                             initial_loss_scale=initial_loss_scale, hysteresis=hysteresis)
    device = device or (params[0].device if params else torch.device("cpu"))
    with _CpuAsCuda(device) if device.type != "cuda" else contextlib.nullcontext():
        scaler = DynamicGradScaler(initial_scale=config.initial_loss_scale,
                            min_scale=config.min_loss_scale, growth_factor=2.0,
                            backoff_factor=0.5, growth_interval=config.loss_scale_window,
                            hysteresis=config.hysteresis) if fp16 else None
        opt = MegatronMixedPrecisionOptimizer(base(params), config, scaler, lambda _: None)
    if device.type == "cuda":
        opt.use_fused_step()
    opt.grad_stats_parallel_group = (ps.get_model_parallel_group() if vote_group == "megatron"
                                     else vote_group)
    return opt


def megatron_optimizer_factory(base: OptimizerFactory,
                               dtype: Optional[torch.dtype]) -> OptimizerFactory:
    """The optimizer factory of a megatron mode: ``base`` itself in fp32 (or ``dtype`` None),
    else ``params -> mixed_precision_optimizer(params, dtype, base)``."""
    if dtype is None or dtype not in _LOW:
        return base
    return lambda params: mixed_precision_optimizer(params, dtype, base)


def master_parameters(optimizer: Any) -> List[torch.Tensor]:
    """The fp32 master copies a megatron mixed-precision optimizer holds (empty for a plain
    torch optimizer)."""
    groups = getattr(optimizer, "fp32_from_float16_groups", None) or []
    return [p for group in groups for p in group]

