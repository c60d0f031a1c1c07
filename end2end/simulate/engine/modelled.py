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
  in fp32 (parameters, gradients, two moments); parameters below
  ``stage3_param_persistence_threshold`` (default 1e5 elements) stay whole on every rank;
* working set: the gathered parameters of the module running and those prefetched
  (``stage3_prefetch_bucket_size``, default 5e7 elements; at least the largest module), and one
  gradient reduce bucket (``reduce_bucket_size``, default 5e8 elements) in the gradient dtype;
* activations: the forward/backward peak of the step simulated on plain PyTorch, with its
  gradients allocated before the step (ZeRO-3 never holds the model's gradients whole: they
  leave through the reduce bucket), so neither they nor the optimizer's moments (created in
  the optimizer phase of the first step) count as activations;
* the optimizer step, one sub-group (``sub_group_size``, default 1e9 elements) of the rank's
  partition at a time: the sub-group's fp32 gradient (fp16/bf16 only) and the torch AdamW's
  multi-tensor temporary (``sqrt`` of the second moment) - 4 + 4 bytes per element, counted
  once, when the activations are gone: the peak is the states plus the larger of
  (activations + working set) and those temporaries (DeepSpeed ``stage3.py``:
  ``_prepare_fp32_grad_for_sub_group``, ``_optimizer_step``);
* collectives per step, over the DP group: one all-gather per module that holds partitioned
  parameters, as DeepSpeed's pre-forward hook fetches it, in the forward and again in the
  backward (again for the recomputation when checkpointing), and a reduce-scatter per reduce
  bucket, all of them once per micro-batch under gradient accumulation; prefetching (bounded by
  the prefetch bucket) overlaps every gather but the first of a phase with the modules before
  it, so the first is exposed;
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
from typing import Any, List, Optional, Tuple


from end2end.simulate.cost.records import CollectiveRecord, OpRecord

__all__ = ["Modelled", "zero3_memory", "zero3_collectives", "module_gathers",
           "zero3_costs", "PREFETCH_ELEMENTS", "REDUCE_BUCKET_ELEMENTS", "PERSISTENCE_ELEMENTS",
           "SUB_GROUP_ELEMENTS"]

PREFETCH_ELEMENTS = int(5e7)  # DeepSpeed stage3_prefetch_bucket_size default
REDUCE_BUCKET_ELEMENTS = int(5e8)  # DeepSpeed reduce_bucket_size default
PERSISTENCE_ELEMENTS = int(1e5)  # DeepSpeed stage3_param_persistence_threshold default
SUB_GROUP_ELEMENTS = int(1e9)  # DeepSpeed sub_group_size default


def zero3_memory(params: int, dp: int, low_precision: bool, largest_module: int,
                 persistent: int = 0) -> dict:
    """Bytes per rank of ZeRO-3's states, working set and optimizer temporaries for ``params``
    parameters on ``dp`` ranks, ``persistent`` of them below the persistence threshold (kept
    whole on every rank; see the module docstring)."""
    half = 2 if low_precision else 4
    master = 12 if low_precision else 8  # fp32 master + 2 moments; fp32: 2 moments only
    gathered = 2 * max(PREFETCH_ELEMENTS, largest_module) * half
    partition = params // dp
    return dict(param=params * (half + (4 if low_precision else 0)) // dp
                + persistent * half * (dp - 1) // dp,
                grad=params * half // dp,
                optstate=params * (master - (4 if low_precision else 0)) // dp,
                working=gathered + min(REDUCE_BUCKET_ELEMENTS, params) * half,
                optimizer_temp=min(SUB_GROUP_ELEMENTS, partition)
                * ((4 if low_precision else 0) + 4))


def zero3_collectives(gathered: List[int], params: int, dp_ranks: tuple, low_precision: bool,
                      recompute: bool, microbatches: int = 1) -> List[CollectiveRecord]:
    """ZeRO-3's collectives of one step on this rank, over the DP group ``dp_ranks``:
    ``gathered``, the elements each module fetches (its partitioned parameters, in module
    order), all-gathered per module in each pass; ``params`` reduce-scattered per bucket. The
    first gather of a pass is ``exposed`` (module docstring). With gradient accumulation every
    one of the ``microbatches`` runs its passes and reduces its gradients (ZeRO-3 accumulates
    the reduced partitions)."""
    if len(dp_ranks) < 2:
        return []
    half = 2 if low_precision else 4
    g = len(dp_ranks)
    out: List[CollectiveRecord] = []
    passes = [("forward", gathered)] + [("backward", gathered[::-1])] * (2 if recompute else 1)
    for phase, sizes in passes:
        out += [CollectiveRecord("allgather", n * half, g, dp_ranks, phase, exposed=i == 0)
                for i, n in enumerate(x for x in sizes if x)]
    full, rest = divmod(params, REDUCE_BUCKET_ELEMENTS)
    out += [CollectiveRecord("reducescatter", REDUCE_BUCKET_ELEMENTS * half, g, dp_ranks,
                             "backward")] * full
    if rest:
        out.append(CollectiveRecord("reducescatter", rest * half, g, dp_ranks, "backward"))
    return out * microbatches


def module_gathers(model) -> Tuple[List[int], int]:
    """Per module (in module order) the elements of its own partitioned parameters (those at or
    above the persistence threshold), and the elements of the persistent ones."""
    sizes, persistent = [], 0
    for m in model.modules():
        own = [p.numel() for p in m.parameters(recurse=False)]
        sizes.append(sum(n for n in own if n >= PERSISTENCE_ELEMENTS))
        persistent += sum(n for n in own if n < PERSISTENCE_ELEMENTS)
    return sizes, persistent


def zero3_costs(modules: int, params: int, param_bytes: int, dtype: str,
                microbatches: int = 1) -> List[OpRecord]:
    """ZeRO-3's per-step Python on a rank whose model has ``modules`` modules (DeepSpeed hooks
    every one), ``params`` trainable parameters of ``param_bytes`` bytes: one record per
    (count, phase), its ``weight`` the count (``cpu_model.RUNTIME_COSTS`` prices them); the
    forward and backward hooks run once per micro-batch, the optimizer's once per step."""
    per_phase = dict(forward=microbatches, backward=microbatches, optimizer=1)
    return [OpRecord(0, 0, dtype, phase, weight=float(count * times), name=f"zero3.{what}")
            for what, count in (("module", modules), ("param", params), ("byte", param_bytes))
            for phase, times in per_phase.items() if count]


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
        gathered, persistent = module_gathers(runner.model)
        zero = zero3_memory(params, self.layout.dp, low, largest, persistent)
        mem = result.memory
        activation = mem["activation"]
        states = zero["param"] + zero["grad"] + zero["optstate"] + mem.get("buffer", 0)
        mem.update({k: zero[k] for k in ("param", "grad", "optstate", "working",
                                         "optimizer_temp")},
                   peak=states + max(activation + zero["working"], zero["optimizer_temp"]))
        ranks = tuple(range(dist.get_world_size()))
        recompute = self.spec.ckpt not in ("0", "0.0")
        micro = self.layout.num_microbatches
        result.collectives.extend(zero3_collectives(gathered, params, ranks, low, recompute,
                                                    micro))
        trained = [p for p in runner.model.parameters() if p.requires_grad]
        result.ops.extend(zero3_costs(
            sum(1 for _ in runner.model.modules()), len(trained),
            sum(p.numel() * p.element_size() for p in trained),
            str(trained[0].dtype).replace("torch.", "") if trained else "float32", micro))


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
    PyTorch in the run's dtype (ZeRO-3 itself is added by :meth:`Modelled.finish`). Its
    gradients exist before the step and the backward accumulates into them (:func:`_zero3_step`),
    so that the forward/backward peak is activations only (module docstring)."""
    import slapo
    import torch

    from end2end.driver.runner import Runner, scheduled_model

    built, _ = slapo.build(scheduled_model(request), target="torch")
    if request.low_precision:
        built = built.to(request.dtype)
    trained = [p for p in built.parameters() if p.requires_grad]
    for p in trained:
        p.grad = torch.zeros_like(p)
    opt = request.optimizer(trained)
    return Runner(request.mode.name, built, opt,
                  _zero3_step(built, opt, request.num_microbatches))


def _zero3_step(model, opt, microbatches: int = 1):
    """The stand-in's training step: forward and backward of each micro-batch into the
    existing gradients, the optimizer's step (the loss read back, as the driver's step does)."""
    from end2end.driver.builders import micro_batches

    device = next(model.parameters()).device

    def step(batch) -> float:
        total = 0.0
        for part in micro_batches(batch, microbatches):
            loss = model(**{k: v.to(device) for k, v in part.items()}).loss
            (loss / microbatches if microbatches > 1 else loss).backward()
            total += loss.detach().item() / microbatches
        opt.step()
        return total

    return step


def _torch_pipeline(request, sch):
    """A DeepSpeed pipeline's stage on slapo's torch pipeline (same schedule and cuts)."""
    import slapo

    from end2end.driver.runner import Runner

    if request.low_precision:  # DeepSpeed's fp16/bf16 engine trains the model cast
        sch.mod.to(request.dtype)
    model, opt = slapo.build(sch, target="torch", optimizer=request.optimizer,
                             n_microbatches=request.num_microbatches)
    return Runner(request.mode.name, model, opt, model.train_step)
