"""A run's parts from its spec and layout, as the driver builds them: the mode's framework
imported (:func:`import_runtime`), the :class:`~end2end.driver.runtimes.Runner`
(:func:`build_runner`) and this rank's synthetic batch (:func:`rank_batch`).

The driver (:mod:`end2end.driver.bench`), the paired A/B check (:mod:`end2end.driver.ab`) and the
simulator (:mod:`end2end.simulate`) build runs through these functions, so a simulated run is the
driver's run; the simulator passes its own builder table (``builders``) for the runtimes it
models.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

__all__ = ["import_runtime", "build_runner", "rank_batch"]


def import_runtime(mode: str, fp32_masters: bool = False) -> None:
    """Import the mode's framework before the memory baseline (its code is not model memory);
    megatron-core also for a run with ``fp32_masters`` (its optimizer keeps them)."""
    from end2end.spec.modes import get_mode

    framework = get_mode(mode).framework
    if framework == "deepspeed":
        from slapo.dialects.compat.deepspeed_startup import import_deepspeed

        import_deepspeed()
    elif framework == "megatron" or fp32_masters:
        import megatron.core  # noqa: F401


def build_runner(spec, layout, torch_dtype, device, builders: Optional[Any] = None):
    """The run's :class:`~end2end.driver.runtimes.Runner` on ``device``: the zoo model (or its
    config for modes that build their own), the Slapo schedule and knobs (with the pipeline
    cuts when ``layout.pp`` > 1), the mode's runtime built by ``builders`` (a
    :class:`~end2end.driver.runner.Builders`; default: the driver's own). ``torch_dtype``: the
    low-precision dtype, ``None`` for fp32 (``RunSpec.low_precision_dtype``)."""
    from end2end.spec.knobs import parse_knobs
    from end2end.models import build_hf_config, build_model, get_model_spec, make_inputs
    from end2end.driver.pipeline_plan import deepspeed_pipeline_config, pipeline_knobs
    from end2end.driver.runner import with_lean_loss
    from end2end.driver.runtimes import (ModelSchedule, default_deepspeed_config,
                                         default_optimizer, make_runner, with_fp32_masters)

    model_spec = get_model_spec(spec.model)
    if spec.mode_info.builds_own_model:
        target = build_hf_config(model_spec)
    else:  # built where it trains: initialising a 1B model on the host takes long
        target = build_model(model_spec, seed=0, device=device)
        if not spec.is_slapo and parse_knobs(spec.knobs).get("lean_loss", False):
            with_lean_loss(target)  # the baselines' knob (end2end.spec.knobs.BASELINE_KNOBS)
    schedule = None
    if spec.is_slapo:
        knobs: Dict[str, Any] = dict(parse_knobs(spec.knobs), ckpt_ratio=spec.ckpt_ratio or 0.0)
        if spec.ckpt_policy:  # CKPT op: every layer, checkpointed selectively
            knobs["ckpt_policy"] = spec.ckpt_policy
        if layout.pp > 1:  # even stages, traced with one micro-batch of the run's shapes
            example = make_inputs(model_spec, layout.micro_batch_size, spec.seq_len,
                                  spec.dec_seq_len, device=device, dtype=torch_dtype)
            knobs.update(pipeline_knobs(model_spec, layout.pp, example))
        schedule = ModelSchedule(model_spec.schedule, knobs)
    ckpt = spec.ckpt if spec.mode_info.ckpt == "megatron" else spec.ckpt != "0"
    if layout.pp > 1:
        ds_config = deepspeed_pipeline_config(layout.micro_batch_size, layout.num_microbatches)
    else:
        ds_config = default_deepspeed_config(layout.micro_batch_size, layout.num_microbatches)
    optimizer = with_fp32_masters(default_optimizer) if spec.fp32_masters else default_optimizer
    return make_runner(spec.mode, target, schedule=schedule, ckpt=ckpt, optimizer=optimizer,
                       deepspeed_config=ds_config, num_microbatches=layout.num_microbatches,
                       seed=0, dtype=torch_dtype, tensor_parallel=layout.tp,
                       pipeline_parallel=layout.pp, builders=builders)


def rank_batch(spec, layout, rank: int, device, dtype):
    """Global rank ``rank``'s synthetic batch on ``device``: one per data-parallel replica
    (TP fastest, then DP), the same for its tensor-parallel ranks and stages."""
    import torch

    from end2end.models import get_model_spec, make_inputs

    gen = torch.Generator().manual_seed(1000 + layout.replica(rank))
    return make_inputs(get_model_spec(spec.model), layout.local_batch, spec.seq_len,
                       spec.dec_seq_len, generator=gen, device=device, dtype=dtype)
