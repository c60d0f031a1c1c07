"""One rank's training step at its real size, through the driver's own code, on fake tensors.

:func:`simulate_rank` takes a validated :class:`~end2end.spec.runspec.RunSpec` and its layout
(:func:`end2end.spec.layout.run_layout`, which raises the same ``ConfigError`` as a real run),
enters :func:`~end2end.simulate.engine.fake_world.fake_world` as one global rank, and builds the run
exactly as the driver does (:func:`end2end.driver.assemble.build_runner`: zoo model, schedule and
knobs, ``make_runner`` and the mode's builder), except for the runtimes that cannot run on fake
tensors, whose builders the run's builder table takes from :mod:`end2end.simulate.engine.modelled`
(``make_runner(builders=...)``: the driver's own table is not touched). Then one
training step (forward, backward, optimizer step: ``runner.train_step``) runs under
:class:`~end2end.simulate.engine.recorder.StepRecorder` which also follows the memory. That step
is the run's first, so the optimizer's lazy state initialisation (AdamW's ``zeros_like`` moments
per parameter), which no later step runs, is left out of its ops (``RankResult.first_step_only``
counts them) and kept in its memory, as the steady step that a run measures holds it. A pipeline
stage's schedule is built first, unrecorded, as a real run builds it in its warm-up
(:func:`build_pipeline_schedule`, through the runtime's public ``prepare``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import torch

from end2end.simulate.cost.records import CollectiveRecord, OpRecord
from end2end.simulate.engine.recorder import StepRecorder, rank_local, storage_keys

__all__ = ["RankResult", "simulate_rank", "simulate_rank_isolated", "rank_result_from_json",
           "build_pipeline_schedule", "steady_memory", "multi_tensor_optimizer",
           "padding_masks_read_as_on_a_real_run"]


@dataclasses.dataclass
class RankResult:
    """What one simulated rank did: its ops and collectives, its memory by category (bytes:
    ``param``, ``grad``, ``optstate``, ``activation``, ``peak``), its parameters (elements) and
    what the modelled runtime (if any) added (``modelled``: a short text, "" when the real
    runtime ran); ``extrapolated`` says how a many-micro-batch step was derived
    (:mod:`end2end.simulate.engine.microbatches`; empty when simulated as it is);
    ``attention``: the SDPA kernels a GPU profile chose (kernel -> calls; empty on ``cpu``);
    ``first_step_only``: the ops of the optimizer's state initialisation, which the recorded
    (first) step ran and later steps do not, left out of ``ops``
    (:meth:`~end2end.simulate.engine.recorder.StepRecorder.leave_out_state_initialisation`)."""

    rank: int
    ops: List[OpRecord]
    collectives: List[CollectiveRecord]
    memory: Dict[str, int]
    parameters: int
    modelled: str = ""
    totals: Dict[str, float] = dataclasses.field(default_factory=dict)
    extrapolated: Dict[str, Any] = dataclasses.field(default_factory=dict)
    attention: Dict[str, int] = dataclasses.field(default_factory=dict)
    first_step_only: int = 0


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages of ``tensors`` (tied weights count once)."""
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = rank_local(t).untyped_storage()  # a DTensor: this rank's shard
            seen[st._cdata] = st.nbytes()
    return sum(seen.values())


def _resident(runner) -> Dict[str, int]:
    """Bytes held by the model and optimizer outside the step's ops."""
    return {k: _storage_bytes(v) for k, v in _state_tensors(runner).items()}


def _state_tensors(runner) -> Dict[str, List[Any]]:
    """The model's and optimizer's tensors by category (see :func:`_resident`)."""
    model, opt = runner.model, runner.optimizer
    params = list(model.parameters()) if hasattr(model, "parameters") else []
    buffers = list(model.buffers()) if hasattr(model, "buffers") else []
    states = [v for s in getattr(opt, "state", {}).values() for v in s.values()]
    if hasattr(opt, "fp32_from_float16_groups"):  # megatron-core's fp32 masters (optimizer's)
        from end2end.driver.megatron_optimizer import master_parameters

        states += master_parameters(opt)
    return dict(param=params, buffer=buffers,
                grad=[p.grad for p in params if p.grad is not None], optstate=states)


def _capability(gpu) -> Optional[Tuple[int, int]]:
    """The simulated GPU's compute capability of ``gpu`` (a ``(major, minor)`` pair, ``True``
    for the default one, falsy for this CPU)."""
    from end2end.simulate.cost.kernels import DEFAULT_CAPABILITY

    if not gpu:
        return None
    return DEFAULT_CAPABILITY if gpu is True else (int(gpu[0]), int(gpu[1]))


def simulate_rank(spec, layout, rank: int, gpu: Any = False) -> RankResult:
    """Build and step global rank ``rank`` of ``spec`` on a fake world of ``spec.n`` ranks;
    ``gpu``: the simulated GPU's compute capability ``(major, minor)`` (``True``: sm80), whose
    attention kernel CUDA would pick runs (:mod:`end2end.simulate.cost.kernels`); falsy: as on
    this CPU."""
    from end2end.driver.assemble import build_runner, rank_batch
    from end2end.driver.measure import local_parameters
    from end2end.simulate.engine.fake_world import fake_world
    from end2end.simulate.cost.kernels import GpuAttention
    from end2end.simulate.cost.megatron_kernels import fused_softmax_kernels
    from end2end.simulate.engine.modelled import Modelled
    from end2end.simulate.cost.records import work_totals

    from slapo.runtime.distributed import init_distributed

    dtype = spec.low_precision_dtype
    modelled = Modelled.for_run(spec, layout)
    # megatron's fused softmax as on a GPU (end2end/simulate/cost/megatron_kernels.py)
    kernels = fused_softmax_kernels() if gpu else contextlib.nullcontext()
    with fake_world(rank, spec.n), kernels:
        env = init_distributed()
        runner = build_runner(spec, layout, dtype, env.device, builders=modelled.builders)
        batch = rank_batch(spec, layout, env.rank, env.device, dtype)
        build_pipeline_schedule(runner, batch)
        if gpu:
            multi_tensor_optimizer(runner.optimizer)
        before = _resident(runner)
        states_before = storage_keys(_state_tensors(runner)["optstate"])
        recorder = StepRecorder()
        hooks = _optimizer_phase(recorder, runner.optimizer)
        capability = _capability(gpu)
        attention = GpuAttention(capability) if capability else contextlib.nullcontext()
        masks = padding_masks_read_as_on_a_real_run()  # every profile: a CPU drops it too
        try:
            with recorder, attention, masks:
                runner.train_step(batch)
        finally:
            for h in hooks:
                h.remove()
        params = local_parameters(runner.model)
        after = _resident(runner)
        first_step_only = recorder.leave_out_state_initialisation(
            t for t in _state_tensors(runner)["optstate"]
            if storage_keys([t]).isdisjoint(states_before))
        base = before["param"] + before["buffer"] + before["grad"] + before["optstate"]
        # + what the step used that existed before it outside that state (DDP's buckets)
        base += recorder.untracked_bytes(t for ts in _state_tensors(runner).values() for t in ts)
        memory = dict(after, **steady_memory(base, recorder.phase_peak, before, after))
        result = RankResult(rank, recorder.ops, recorder.collectives, memory, params,
                            attention=dict(getattr(attention, "chosen", {})),
                            first_step_only=first_step_only)
        modelled.finish(result, runner)
        # after what a modelled runtime adds (ZeRO-3's collectives and Python)
        result.totals = work_totals(result.ops, result.collectives)
        return result


def steady_memory(base: int, phase_peak: Dict[str, int], before: Dict[str, int],
                  after: Dict[str, int]) -> Dict[str, int]:
    """``peak`` and ``activation`` of a training step in its steady state, from the first step
    recorded: ``base`` (bytes resident when the step began), the recorder's peak of live bytes
    per phase, and the states before and after the step (:func:`_resident`).

    The first step creates the optimizer's states (AdamW's moments) in its optimizer phase; every
    later step starts with them, so they are added to the forward/backward peak, and the
    optimizer phase's own peak (states, gradients and the optimizer's temporaries, counted once)
    is the other candidate (and what follows the step, ``after``). ``activation`` is what the
    forward/backward peak holds beyond the states after the step. Without an optimizer phase
    (an optimizer that calls no step hooks), the step's overall peak, as recorded."""
    compute = max(phase_peak.get("forward", 0), phase_peak.get("backward", 0))
    states = sum(after.values())
    if "optimizer" not in phase_peak:
        peak = base + max(phase_peak.values(), default=0)
        return dict(peak=peak, activation=max(0, peak - states))
    created = max(0, after["optstate"] - before["optstate"])
    peak = base + max(compute + created, phase_peak["optimizer"], phase_peak.get("after", 0))
    return dict(peak=peak, activation=max(0, base + compute + created - states),
                optimizer_peak=base + phase_peak["optimizer"])


def multi_tensor_optimizer(optimizer) -> bool:
    """On a GPU profile, a torch optimizer left to choose its implementation (``foreach`` not
    set) runs its multi-tensor (``foreach``) form, as PyTorch picks it for CUDA tensors
    (``torch.optim.optimizer._default_to_fused_or_foreach``); fake tensors live on the CPU, where
    it would pick the per-parameter loop. Its temporaries then count as on the GPU: AdamW's
    ``sqrt`` of the second moments is one tensor list over all parameters at once. A wrapper
    that steps a torch optimizer of its own has that one switched; megatron-core's
    mixed-precision optimizer (the megatron modes', ``fp32_masters``'), whose fp32 masters the
    driver steps with torch's fused kernel on CUDA, as Megatron-LM and apex's O2 step theirs,
    switches its own (``use_fused_step``). True if it was switched."""
    from torch.distributed.tensor import DTensor

    fused = getattr(optimizer, "use_fused_step", None)
    if fused is not None:
        return bool(fused())

    inner = getattr(optimizer, "optimizer", None)
    if not isinstance(optimizer, torch.optim.Optimizer) and isinstance(inner,
                                                                       torch.optim.Optimizer):
        optimizer = inner
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(optimizer, torch.optim.Optimizer) or not groups or \
            "foreach" not in optimizer.defaults or optimizer.defaults.get("foreach") is not None:
        return False
    kinds = {isinstance(p, DTensor) for g in groups for p in g["params"]}
    if len(kinds) > 1:  # DTensor and plain parameters mixed (a TP plan's replicated ones):
        return False    # one foreach call cannot take both
    for group in groups:
        if group.get("foreach") is None and not group.get("fused") \
                and not group.get("differentiable"):
            group["foreach"] = True
    return True


@contextlib.contextmanager
def padding_masks_read_as_on_a_real_run():
    """Within: HuggingFace models decide whether to drop their padding mask as on a real run.
    HF drops an all-ones padding mask before SDPA (``transformers.masking_utils``: attention then
    runs with ``is_causal``, or without a mask, and a GPU can take the flash kernel), on any
    device, but never for a fake tensor, which it counts as tracing (``is_tracing``) since it
    cannot read its values: every simulated HF model kept a materialised ``B x 1 x s x s`` mask
    (its bytes and its traffic; on a GPU it also ruled flash out) that no real run builds. The
    driver's synthetic masks are all ones (:func:`end2end.models.make_inputs`), and the recorder
    reads a fake scalar as 1 (true), so with a tensor's fakeness no longer counted as tracing
    (dynamo, jit and fx tracing still are) HF skips the mask as a real run does."""
    import transformers.masking_utils as masking
    from transformers.utils import is_torch_fx_proxy

    original = masking.is_tracing

    def is_tracing(tensor=None) -> bool:
        return original(None) or (tensor is not None and is_torch_fx_proxy(tensor))

    masking.is_tracing = is_tracing
    try:
        yield
    finally:
        masking.is_tracing = original


def build_pipeline_schedule(runner, batch) -> bool:
    """Build a pipeline stage's schedule before the recorded step (True if ``runner`` is one).

    A stage builds it in its first step, or earlier through the runtime's public
    :meth:`slapo.dialects.torch_pipeline.PipelineModel.prepare` (used here): the stages before
    it run once on one micro-batch, in this process, to derive its example inputs. A real run
    does that in its warm-up, outside the measured steps, so the recorded step here is the
    steady one; the build runs under a recorder of its own (discarded) so that fake reads behave
    as in the step. On the way the stage's unpacking of ints and shapes received packed in tensors
    learns their values (:mod:`end2end.simulate.engine.pipeline_values`), which the fake receive
    buffers do not carry."""
    from end2end.simulate.engine.pipeline_values import remember_packed_values

    from slapo.dialects.torch_pipeline import PipelineModel

    model = runner.model
    if not isinstance(model, PipelineModel):
        return False
    remember_packed_values(model.module)
    if model.runner.schedule is None:
        with StepRecorder():
            model.prepare(batch)
    return True


class _WrapperStep:
    """While installed: the whole ``step`` of an optimizer that wraps a torch optimizer
    (megatron-core's mixed-precision optimizer: the gradients copied into fp32, unscaled, the
    inner step, the masters copied back) is the ``optimizer`` phase, not only its inner step."""

    def __init__(self, recorder: StepRecorder, optimizer: Any):
        self.optimizer, self.step = optimizer, optimizer.step

        def step(*args, **kwargs):
            recorder.phase, recorder.in_wrapper_step = "optimizer", True
            try:
                return self.step(*args, **kwargs)
            finally:
                recorder.phase, recorder.in_wrapper_step = "forward", False
                recorder.stepped = True

        optimizer.step = step

    def remove(self) -> None:
        del self.optimizer.step  # the class's method again


def _optimizer_phase(recorder: StepRecorder, optimizer: Any = None) -> List[Any]:
    """Global optimizer hooks: ops between an optimizer's pre and post step are ``optimizer``;
    for ``optimizer`` that wraps a torch optimizer, its whole step (:class:`_WrapperStep`)."""
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)

    def pre(*_):
        recorder.phase = "optimizer"

    def post(*_):
        if not recorder.in_wrapper_step:
            recorder.phase = "forward"
            recorder.stepped = True

    hooks = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
    if not isinstance(optimizer, torch.optim.Optimizer) and isinstance(
            getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        hooks.append(_WrapperStep(recorder, optimizer))
    return hooks


def _rank_json(spec_json: str, layout: Dict[str, int], rank: int, gpu: Any) -> Dict[str, Any]:
    """:func:`simulate_rank` of a JSON RunSpec and a layout record, as JSON (for
    :func:`simulate_rank_isolated`)."""
    from end2end.spec.layout import Layout
    from end2end.spec.runspec import RunSpec

    return dataclasses.asdict(simulate_rank(RunSpec.from_json(spec_json),
                                            Layout.from_record(layout), rank, gpu))


def rank_result_from_json(data: Dict[str, Any]) -> RankResult:
    """The :class:`RankResult` of ``dataclasses.asdict(result)``."""
    data = dict(data, ops=[OpRecord(**dict(o, shape=tuple(o.get("shape", ()))))
                           for o in data["ops"]],
                collectives=[CollectiveRecord(**dict(c, ranks=tuple(c["ranks"])))
                             for c in data["collectives"]])
    return RankResult(**data)


def simulate_rank_isolated(spec, layout, rank: int, gpu: Any = False
                           ) -> RankResult:
    """:func:`simulate_rank` in a fresh process (:mod:`end2end.simulate.engine.isolated`): for a run
    that needs several simulations (pipeline stages, micro-batch extrapolation)."""
    from end2end.simulate.engine.isolated import isolated

    return rank_result_from_json(isolated("end2end.simulate.engine.step._rank_json",
                                          spec.to_json(), layout.as_record(), rank, gpu))
