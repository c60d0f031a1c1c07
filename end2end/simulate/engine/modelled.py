"""Runtimes that cannot run on fake tensors, modelled from their configuration.

DeepSpeed's engine (ZeRO-3, and its ``PipelineEngine``) partitions parameters through its own
hooks and CUDA/host buffers that fake tensors cannot take. For the ``deepspeed`` and
``slapo-deepspeed`` modes the simulator therefore runs everything up to the engine exactly as
the driver does (zoo model, schedule, knobs, ``scheduled_model``), runs that model's training
step on plain PyTorch on fake tensors (the model cast to the run's dtype, as DeepSpeed's fp16/bf16
engine holds it), and replaces what ZeRO-3 changes by its model (:func:`zero3_memory`,
:func:`zero3_collectives`):

* states per rank: ``(2 + 2 + K) x P / DP`` bytes for P parameters in fp16/bf16 (the low-precision
  parameters and gradients, and K = 12: fp32 master weights, Adam's two moments), ``16 x P / DP``
  in fp32 (parameters, gradients, two moments);
* working set: the gathered parameters of the layer running and the one prefetched
  (``stage3_prefetch_bucket_size``, default 5e7 elements; at least the largest module), and one
  gradient reduce bucket (``reduce_bucket_size``, default 5e8 elements) in the gradient dtype;
* collectives per step, over the DP group: an all-gather of every parameter in the forward, again
  in the backward (again for the recomputation when checkpointing), a reduce-scatter of every
  gradient; DeepSpeed prefetches and overlaps them with compute;
* its Python outside the recorded ops (:func:`zero3_costs`): per phase, the rank's hooked
  modules (every module of the model), parameters and parameter bytes, charged on the ``cpu``
  profile at the seconds per module / parameter / byte measured with a real ZeRO-3 engine
  (:mod:`end2end.simulate.calibration.zero3`); GPU profiles charge nothing for them.

Pipelines (``--pp`` > 1) of ``slapo-deepspeed`` run as DeepSpeed pipelines; the simulator builds
the same schedule with the same stage cuts and runs the rank's stage on slapo's torch pipeline
(:mod:`slapo.dialects.torch_pipeline`) instead, on fake tensors: its stage's parameters,
activations for the same micro-batches and its point-to-point transfers are the ones recorded;
the peak memory counts the micro-batches DeepSpeed's 1F1B order keeps in flight on the stage,
``min(M, P - stage)`` (:mod:`end2end.simulate.engine.microbatches`), and in fp16/bf16 the stage is
cast
as DeepSpeed's engine holds it, with its optimizer states (ZeRO stage 0: fp32 master weights and
two fp32 moments, ``12 x P`` bytes) in place of the simulated AdamW's. The rows say
``modelled: ...`` in their JSON ``extra`` and the docs (docs/simulate.md) list this.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional


from end2end.simulate.cost.records import CollectiveRecord, OpRecord

__all__ = ["Modelled", "zero3_memory", "zero3_collectives",
           "zero3_costs", "PREFETCH_ELEMENTS", "REDUCE_BUCKET_ELEMENTS"]

PREFETCH_ELEMENTS = int(5e7)  # DeepSpeed stage3_prefetch_bucket_size default
REDUCE_BUCKET_ELEMENTS = int(5e8)  # DeepSpeed reduce_bucket_size default


def zero3_memory(params: int, dp: int, low_precision: bool, largest_module: int) -> dict:
    """Bytes per rank of ZeRO-3's states and working set for ``params`` parameters on ``dp``
    ranks (see the module docstring)."""
    half = 2 if low_precision else 4
    master = 12 if low_precision else 8  # fp32 master + 2 moments; fp32: 2 moments only
    gathered = 2 * max(PREFETCH_ELEMENTS, largest_module) * half
    return dict(param=params * (half + (4 if low_precision else 0)) // dp,
                grad=params * half // dp,
                optstate=params * (master - (4 if low_precision else 0)) // dp,
                working=gathered + min(REDUCE_BUCKET_ELEMENTS, params) * half)


def zero3_collectives(params: int, dp_ranks: tuple, low_precision: bool, recompute: bool
                      ) -> List[CollectiveRecord]:
    """ZeRO-3's collectives of one step on this rank, over the DP group ``dp_ranks``."""
    if len(dp_ranks) < 2:
        return []
    size = params * (2 if low_precision else 4)
    gathers = [("forward", "allgather")] + [("backward", "allgather")] * (2 if recompute else 1)
    return [CollectiveRecord(kind, size, len(dp_ranks), dp_ranks, phase)
            for phase, kind in gathers + [("backward", "reducescatter")]]


def zero3_costs(modules: int, params: int, param_bytes: int, dtype: str) -> List[OpRecord]:
    """ZeRO-3's per-step Python on a rank whose model has ``modules`` modules (DeepSpeed hooks
    every one), ``params`` trainable parameters of ``param_bytes`` bytes: one record per
    (count, phase), its ``weight`` the count (``cpu_model.RUNTIME_COSTS`` prices them)."""
    return [OpRecord(0, 0, dtype, phase, weight=float(count), name=f"zero3.{what}")
            for what, count in (("module", modules), ("param", params), ("byte", param_bytes))
            for phase in ("forward", "backward", "optimizer") if count]


@dataclasses.dataclass
class Modelled:
    """A run's modelled runtime (see the module docstring): ``builders``, the builder table
    to build the run with (``make_runner(builders=...)``; ``None``: the driver's own), and
    what the model changes in a rank's result (:meth:`finish`); ``text`` is empty when the real
    runtime runs."""

    spec: Any
    layout: Any
    text: str = ""
    builders: Optional[Any] = None

    @classmethod
    def for_run(cls, spec, layout) -> "Modelled":
        """The modelled runtime of ``spec`` with ``layout``: for the DeepSpeed modes, the
        driver's builder table with ZeRO-3 (no pipeline) or the pipeline builder (``pp`` > 1)
        replaced by its model; the driver's table itself is never changed."""
        from end2end.driver.runtimes import default_builders

        if spec.framework != "deepspeed":
            return cls(spec, layout)
        if layout.pp > 1:
            return cls(spec, layout, "DeepSpeed pipeline simulated as slapo's torch pipeline "
                       "of the same stages; memory for 1F1B's min(M, P - stage) micro-batches "
                       "in flight", default_builders().replace(pipeline=_torch_pipeline))
        # the rows' text, kept as committed results have it (the module's path before issue 34)
        return cls(spec, layout, "ZeRO-3 modelled: states / DP, prefetched all-gathers, "
                   "reduce-scatter (end2end.simulate.modelled)",
                   default_builders().replace({spec.mode: _zero3_builder}))

    def finish(self, result, runner) -> None:
        result.modelled = self.text
        if self.spec.framework != "deepspeed":
            return
        if self.layout.pp > 1:
            _pipeline_master_states(result, (self.spec.dtype or "fp32") != "fp32")
            return
        import torch.distributed as dist

        low = (self.spec.dtype or "fp32") != "fp32"
        params = result.parameters
        largest = max((sum(p.numel() for p in m.parameters(recurse=False))
                       for m in runner.model.modules()), default=0)
        zero = zero3_memory(params, self.layout.dp, low, largest)
        mem = result.memory
        activation = mem["activation"]
        mem.update({k: zero[k] for k in ("param", "grad", "optstate")},
                   working=zero["working"],
                   peak=activation + sum(zero.values()) + mem.get("buffer", 0))
        ranks = tuple(range(dist.get_world_size()))
        recompute = self.spec.ckpt not in ("0", "0.0")
        result.collectives.extend(zero3_collectives(params, ranks, low, recompute))
        trained = [p for p in runner.model.parameters() if p.requires_grad]
        result.ops.extend(zero3_costs(
            sum(1 for _ in runner.model.modules()), len(trained),
            sum(p.numel() * p.element_size() for p in trained),
            str(trained[0].dtype).replace("torch.", "") if trained else "float32"))


def _pipeline_master_states(result, low_precision: bool) -> None:
    """A DeepSpeed pipeline's optimizer states (ZeRO stage 0): in fp16/bf16 an fp32 master copy
    and Adam's two fp32 moments, ``12 x P`` bytes, where the simulated AdamW on the cast stage
    kept two low-precision moments; the peak moves by the difference."""
    if not low_precision:
        return
    mem = result.memory
    states = 12 * result.parameters
    mem["peak"] += states - mem["optstate"]
    mem["optstate"] = states


def _zero3_builder(request):
    """DeepSpeed's mode on fake tensors: the same scheduled model, trained one step on plain
    PyTorch in the run's dtype (ZeRO-3 itself is added by :meth:`Modelled.finish`)."""
    import slapo

    from end2end.driver.builders import plain_torch_step
    from end2end.driver.runner import Runner, scheduled_model

    built, _ = slapo.build(scheduled_model(request), target="torch")
    if request.low_precision:
        built = built.to(request.dtype)
    opt = request.optimizer([p for p in built.parameters() if p.requires_grad])
    return Runner(request.mode.name, built, opt, plain_torch_step(built, opt))


def _torch_pipeline(request, sch):
    """A DeepSpeed pipeline's stage on slapo's torch pipeline (same schedule and cuts)."""
    import slapo

    from end2end.driver.runner import Runner

    if request.low_precision:  # DeepSpeed's fp16/bf16 engine trains the model cast
        sch.mod.to(request.dtype)
    model, opt = slapo.build(sch, target="torch", optimizer=request.optimizer,
                             n_microbatches=request.num_microbatches)
    return Runner(request.mode.name, model, opt, model.train_step)
