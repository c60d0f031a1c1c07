"""Pipeline-parallel runs of the benchmark driver: which modes pipeline, where the stages are cut.

``--pp P`` (or ``#@ pp=P`` in a config) splits the model into ``P`` stages:

* **Modes.** ``slapo`` runs the stages with the torch pipeline dialect
  (:mod:`slapo.dialects.torch_pipeline`: ``torch.distributed.pipelining``, GPipe), and
  ``slapo-deepspeed`` as a DeepSpeed ``PipelineModule`` (:mod:`slapo.dialects.deepspeed_pipeline`;
  ZeRO is off: ZeRO-2/3 do not combine with DeepSpeed pipelines). Both lay the world out as
  TP x DP x PP (:mod:`slapo.dialects.layout`: TP fastest, then the data-parallel replica, then the
  stage). The other modes cannot pipeline here: :func:`check_pipeline_mode` says what to use.
* **Cuts** (:func:`even_cuts`, :func:`stage_cuts`): the model's layers, every stack of it in
  order (T5: encoder then decoder blocks; WideResNet: its four Bottleneck stacks), are split into
  ``P`` contiguous stages of equal size, the first ``L mod P`` stages one layer longer. The
  embeddings go with the first stage, the head with the last. The cuts become the model
  schedule's ``pipeline_cuts`` knob (:func:`pipeline_knobs`), traced with ``example_inputs`` of
  one micro-batch.
* **Micro-batches** (:func:`default_micro_batch`): ``--micro-batch-size`` when given; otherwise
  the replica's batch is split into ``P`` micro-batches when it divides (so that every stage is
  busy in the steady state), else it is one micro-batch.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Union

from slapo.errors import ConfigError

from end2end.spec.layout import check_pipeline_mode, default_micro_batch  # re-exported

__all__ = ["check_pipeline_mode", "even_cuts", "stage_cuts", "layer_stacks",
           "pipeline_knobs", "default_micro_batch", "deepspeed_pipeline_config"]

def even_cuts(num_layers: int, stages: int) -> List[int]:
    """Indices of the layers that end stages ``0 .. stages-2`` when ``num_layers`` layers are
    split into ``stages`` contiguous stages of equal size (the first ``num_layers % stages``
    stages get one layer more). ``even_cuts(24, 4) == [5, 11, 17]``, ``even_cuts(5, 2) == [2]``.

    Raises:
        ConfigError: fewer layers than stages, or a size below 1.
    """
    if stages < 1 or num_layers < 1:
        raise ConfigError(f"cannot split {num_layers} layer(s) into {stages} stage(s)",
                          call="end2end.driver.pipeline_plan", hint="both must be >= 1")
    if stages > num_layers:
        raise ConfigError(f"--pp {stages}: the model has only {num_layers} layer(s) to split "
                          "into pipeline stages", call="end2end.bench",
                          hint=f"use at most {num_layers} stages")
    base, extra = divmod(num_layers, stages)
    cuts, end = [], -1
    for s in range(stages - 1):
        end += base + (1 if s < extra else 0)
        cuts.append(end)
    return cuts


def stage_cuts(stack_sizes: Sequence[int], stages: int) -> Union[List[int], List[List[int]]]:
    """:func:`even_cuts` over the concatenation of several layer stacks, as the model schedules'
    ``pipeline_cuts`` knob takes it: a flat list of layer indices for one stack, else one list
    per stack (indices local to the stack). ``stage_cuts([2, 2], 2) == [[1], []]`` (T5: the
    encoder is stage 0, the decoder stage 1)."""
    sizes = [int(s) for s in stack_sizes]
    if not sizes or any(s < 0 for s in sizes):
        raise ConfigError(f"invalid layer stacks {sizes}", call="end2end.driver.pipeline_plan",
                          hint="the model needs at least one stack of layers")
    cuts = even_cuts(sum(sizes), stages)
    if len(sizes) == 1:
        return cuts
    per_stack: List[List[int]] = [[] for _ in sizes]
    for cut in cuts:
        start = 0
        for k, size in enumerate(sizes):
            if cut < start + size:
                per_stack[k].append(cut - start)
                break
            start += size
    return per_stack


def layer_stacks(model_spec: Any) -> List[int]:
    """The layer counts of the stacks a model schedule cuts (see the module docstring)."""
    if model_spec.is_vision:
        return list(model_spec.block_layers)
    if model_spec.is_encoder_decoder:
        return [model_spec.layers, model_spec.decoder_layers]
    return [model_spec.layers]


def pipeline_knobs(model_spec: Any, stages: int, example_inputs: Dict[str, Any]
                   ) -> Dict[str, Any]:
    """The model-schedule knobs that cut ``model_spec`` into ``stages`` even stages."""
    return dict(pipeline_cuts=stage_cuts(layer_stacks(model_spec), stages),
                example_inputs=example_inputs)


def deepspeed_pipeline_config(micro_batch: int, microbatches: int) -> Dict[str, Any]:
    """DeepSpeed config of a ``slapo-deepspeed`` pipeline run: ``micro_batch`` x
    ``microbatches`` samples per replica and step, no ZeRO (stage 0), no gradient clipping."""
    return {"train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": microbatches, "gradient_clipping": 0.0,
            "zero_optimization": {"stage": 0}, "steps_per_print": 10 ** 9}
