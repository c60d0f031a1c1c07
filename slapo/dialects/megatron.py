"""The ``megatron`` target: the scheduled model driven by megatron-core's training runtime.

A Slapo tensor-parallel model and a native megatron-core model run under the same machinery:

* process groups: megatron-core's ``parallel_state`` (``initialize_model_parallel``); the
  schedule's tensor-parallel group *is* megatron's. Call :func:`initialize_megatron` first and give
  its group to ``create_schedule``::

      tp_group = slapo.dialects.megatron.initialize_megatron(tensor_model_parallel_size=2)
      sch = slapo.create_schedule(model, group=tp_group)
      ...  # shard / sync
      runtime, optimizer = slapo.build(sch, target="megatron")
      loss = runtime.train_step(batch)

  (Without that call, ``build`` initialises megatron with TP = the schedule's group size, which
  must then be the whole world.)
* RNG: ``model_parallel_cuda_manual_seed`` (megatron's tracker; on CPU through the shim of
  :mod:`slapo.dialects.compat.megatron_cpu`) plus Slapo's own tracker (``fork_rng``), seeded alike.
* the step: megatron's ``get_forward_backward_func()`` with a forward-step function that runs
  ``loss_fn(model, micro_batch)``, then a data-parallel gradient all-reduce (megatron's
  ``finalize_model_grads_func`` hook), then the optimizer.

:class:`MegatronRuntime.train_step` is the whole API: see its docstring. Pipeline cuts are not
supported yet.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from ..runtime.distributed import default_timeout, init_distributed, register_teardown
from ..errors import BuildError, ConfigError
from ..runtime.rng import set_random_seed
from .common import OptimizerArg, make_optimizer, reject_pipeline_cuts, tp_ranks
from .registry import Dialect, register_dialect

__all__ = ["initialize_megatron", "MegatronRuntime", "MegatronDialect", "hf_loss"]

_INSTALL_HINT = "install it with `pip install megatron-core==0.16.1`"
Batch = Dict[str, torch.Tensor]
LossFn = Callable[[nn.Module, Batch], torch.Tensor]


def _parallel_state():
    try:
        from megatron.core import parallel_state
    except ImportError as e:
        raise BuildError(f"megatron-core is not installed ({e})", call="build(target='megatron')",
                         hint=_INSTALL_HINT) from e
    return parallel_state


def initialize_megatron(tensor_model_parallel_size: Optional[int] = None, *,
                        seed: int = 1234) -> dist.ProcessGroup:
    """Set up megatron-core's parallel state and RNG; return its tensor-parallel group.

    Initialises ``torch.distributed`` if needed
    (:func:`slapo.runtime.distributed.init_distributed`), applies the CPU shim when no GPU is used,
    calls ``initialize_model_parallel`` (TP = ``tensor_model_parallel_size``, default the world
    size; the rest is data parallelism) and seeds megatron's and Slapo's RNG trackers with
    ``seed``. A second call with the same size returns the existing group.

    Raises:
        ConfigError: the world size is not a multiple of the tensor-parallel size.
        BuildError: megatron is missing, or already initialised with another size.
    """
    env = init_distributed()
    ps = _parallel_state()
    if env.device.type == "cpu":
        from .compat.megatron_cpu import apply_megatron_cpu_shim

        apply_megatron_cpu_shim()
    tp = tensor_model_parallel_size or env.world_size
    if tp < 1 or env.world_size % tp:
        raise ConfigError(f"tensor-parallel size {tp} does not divide the world size "
                          f"{env.world_size}", call="initialize_megatron",
                          hint="use a divisor of the number of ranks")
    if ps.model_parallel_is_initialized():
        if ps.get_tensor_model_parallel_world_size() != tp:
            raise BuildError(
                f"megatron is already initialised with tensor-parallel size "
                f"{ps.get_tensor_model_parallel_world_size()}, not {tp}",
                call="initialize_megatron", hint="call slapo.runtime.distributed.teardown() first")
        return ps.get_tensor_model_parallel_group()
    minutes = max(1, int(default_timeout().total_seconds() // 60))
    ps.initialize_model_parallel(tensor_model_parallel_size=tp,
                                 distributed_timeout_minutes=minutes)
    register_teardown(_destroy_megatron)
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(seed)
    set_random_seed(seed, tp_rank=ps.get_tensor_model_parallel_rank())
    return ps.get_tensor_model_parallel_group()


def _destroy_megatron() -> None:
    from .compat.megatron_cpu import remove_megatron_cpu_shim

    _parallel_state().destroy_model_parallel()
    remove_megatron_cpu_shim()


def hf_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The default loss: ``model(**batch).loss`` (a HuggingFace model given ``labels``)."""
    return model(**batch).loss


def _split(batch: Batch, n: int) -> List[Batch]:
    sizes = {v.shape[0] for v in batch.values()}
    if len(sizes) != 1 or next(iter(sizes)) % n:
        raise ConfigError(f"cannot split a batch with leading sizes {sorted(sizes)} into {n} "
                          "micro-batches", call="train_step",
                          hint="use a batch size that is a multiple of num_microbatches")
    chunks = {k: v.chunk(n) for k, v in batch.items()}
    return [{k: c[i] for k, c in chunks.items()} for i in range(n)]


class _Chunk:
    """What megatron's schedule needs from a "model chunk": ``config``, ``model_type`` and
    ``set_input_tensor`` (a no-op without pipelining)."""

    def __init__(self, module: nn.Module, finalize: Callable[..., None]):
        from megatron.core.enums import ModelType
        from megatron.core.model_parallel_config import ModelParallelConfig

        ps = _parallel_state()
        own = getattr(module, "config", None)
        config = own if isinstance(own, ModelParallelConfig) else ModelParallelConfig(
            tensor_model_parallel_size=ps.get_tensor_model_parallel_world_size())
        for attr in ("fine_grained_activation_offloading", "calculate_per_token_loss"):
            if not hasattr(config, attr):  # read by the schedule, defined on TransformerConfig
                setattr(config, attr, False)
        config.finalize_model_grads_func = finalize
        self.module, self.config = module, config
        self.model_type = getattr(module, "model_type", ModelType.encoder_or_decoder)
        decoder = getattr(module, "decoder", None)
        if decoder is not None and not hasattr(decoder, "layers"):
            # megatron's schedule tags ``<model>.decoder.layers`` with the micro-batch index; a
            # HF encoder-decoder (T5's ``decoder`` stack has ``block``) has no such layers.
            self.decoder = SimpleNamespace(layers=())

    def set_input_tensor(self, tensor: Any) -> None:
        setter = getattr(self.module, "set_input_tensor", None)
        if setter is not None:
            setter(tensor)


class MegatronRuntime:
    """A model trained by megatron-core's runtime; created by ``build(target="megatron")`` (or
    directly for a native megatron-core model).

    Args:
        module: the model on this rank (a Slapo-built model or a megatron-core model).
        optimizer: any torch optimizer over ``module``'s parameters.
        loss_fn: ``fn(module, micro_batch) -> scalar loss`` (mean over the micro-batch);
            default :func:`hf_loss`.
        num_microbatches: micro-batches per step (gradient accumulation inside megatron's
            schedule).
    """

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: Optional[LossFn] = None, num_microbatches: int = 1):
        from megatron.core.pipeline_parallel import get_forward_backward_func

        ps = _parallel_state()
        self.module, self.optimizer = module, optimizer
        self.loss_fn = loss_fn or hf_loss
        self.num_microbatches = num_microbatches
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.dp_group = ps.get_data_parallel_group()
        self._tp_src = ps.get_tensor_model_parallel_src_rank()
        self._chunk = _Chunk(module, self._reduce_data_parallel_grads)
        # a megatron-core optimizer's loss scale (fp16), applied as Megatron-LM's training loop
        self._chunk.config.grad_scale_func = getattr(optimizer, "scale_loss", None)
        self._forward_backward = get_forward_backward_func()

    def train_step(self, batch: Batch) -> float:
        """One optimizer step on ``batch``; returns the loss averaged over micro-batches and
        data-parallel ranks.

        ``batch`` holds this rank's keyword inputs (tensors with the batch first). Tensor-parallel
        ranks train on the batch of their group's first rank (broadcast here, as megatron does);
        data-parallel ranks on their own. The batch is split into ``num_microbatches``; megatron's
        forward-backward function runs them and divides each loss by their number; gradients are
        then averaged over the data-parallel group and the optimizer steps.
        """
        device = next(self.module.parameters()).device
        batch = self._broadcast_tp({k: v.to(device) for k, v in batch.items()})
        micro = _split(batch, self.num_microbatches)
        first = next(iter(batch.values()))
        self.optimizer.zero_grad(set_to_none=True)
        losses = self._forward_backward(
            forward_step_func=self._forward_step, data_iterator=iter(micro),
            model=[self._chunk], num_microbatches=self.num_microbatches,
            seq_length=first.shape[1] if first.dim() > 1 else 1,
            micro_batch_size=first.shape[0] // self.num_microbatches,
        )
        self.optimizer.step()
        loss = torch.stack([d["loss"] for d in losses]).mean()
        if dist.get_world_size(self.dp_group) > 1:
            dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=self.dp_group)
        return loss.item()

    def _forward_step(self, data_iterator, chunk: _Chunk) -> Tuple[torch.Tensor, Callable]:
        loss = self.loss_fn(chunk.module, next(data_iterator))
        return loss, _report

    def _broadcast_tp(self, batch: Batch) -> Batch:
        if dist.get_world_size(self.tp_group) == 1:
            return batch
        out = {}
        for key in sorted(batch):
            t = batch[key].clone(memory_format=torch.contiguous_format)  # never the caller's
            dist.broadcast(t, src=self._tp_src, group=self.tp_group)
            out[key] = t
        return out

    def _reduce_data_parallel_grads(self, chunks: list, num_tokens: Any = None,
                                    **_: Any) -> None:
        """Megatron's ``finalize_model_grads_func`` hook: average gradients over data-parallel
        ranks (one flat all-reduce). Replicated parameters of a tensor-parallel model already get
        equal gradients on every tensor-parallel rank (no sequence parallelism)."""
        if dist.get_world_size(self.dp_group) == 1:
            return
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=self.dp_group)
        for g, r in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            g.copy_(r)


def _report(loss: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    return loss, {"loss": loss.detach().clone()}


@register_dialect
class MegatronDialect(Dialect):
    """``build(sch, target="megatron", optimizer=None, loss_fn=None, num_microbatches=1)`` ->
    ``(MegatronRuntime, optimizer)``; see the module docstring."""

    name = "megatron"
    options = ("optimizer", "loss_fn", "num_microbatches")

    def build(self, sch, model: nn.Module, optimizer: OptimizerArg = None,
              loss_fn: Optional[LossFn] = None,
              num_microbatches: int = 1) -> Tuple[MegatronRuntime, torch.optim.Optimizer]:
        reject_pipeline_cuts(sch, self.name)
        env = init_distributed()
        ps = _parallel_state()
        if not ps.model_parallel_is_initialized():
            initialize_megatron(len(tp_ranks(sch.group)))
        if tp_ranks(sch.group) != tp_ranks(ps.get_tensor_model_parallel_group()):
            raise BuildError(
                f"the schedule's group (ranks {tp_ranks(sch.group)}) is not megatron's "
                f"tensor-parallel group (ranks {tp_ranks(ps.get_tensor_model_parallel_group())})",
                call="build(target='megatron')",
                hint="create the schedule with create_schedule(model, "
                     "group=slapo.dialects.megatron.initialize_megatron(tp_size))")
        if not isinstance(num_microbatches, int) or num_microbatches < 1:
            raise BuildError(f"num_microbatches must be a positive int, got {num_microbatches!r}",
                             call="build(target='megatron')", hint="e.g. num_microbatches=1")
        model.to(env.device)
        opt = make_optimizer(model, optimizer)
        return MegatronRuntime(model, opt, loss_fn, num_microbatches), opt
