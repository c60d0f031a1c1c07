"""A first-order time estimate of a candidate, to choose which candidates to simulate first.

Not a prediction (the simulator is): it only orders the space. A step of ``B`` samples on ``n``
devices costs

* compute: ``B x train FLOPs per sample x (1 + r / 3) / (n x peak x gemm efficiency x
  t / (t + 512))``, with ``r`` the recomputed fraction of layers (a recomputed forward is a
  third of a training step) and ``t`` the tokens of one micro-batch per TP rank (small GEMMs
  run below the peak);
* tensor parallelism: four all-reduces of a micro-batch's activations per layer (two forward,
  two backward, two more when recomputed), on NVLink, never hidden;
* data parallelism: the gradients' all-reduce (DDP, megatron, DeepSpeed pipelines: once a
  step) or ZeRO-3/FSDP's two all-gathers and one reduce-scatter of the weights (once per
  micro-batch under gradient accumulation), over NVLink inside a node and the node's network
  share across nodes, exposed where longer than the backward pass, and slowing the compute it
  overlaps as the simulator does (``overlap_slowdown``);
* the host: eager PyTorch issues about :data:`OPS_PER_LAYER` ops per layer and micro-batch
  (forward and backward), each at least the profile's ``host_op_s``;
* the pipeline bubble: ``(PP - 1) / M`` of the pipelined time, ``M`` micro-batches per replica.

Each term uses the cluster's peak, NVLink and network numbers from the simulator's profile.

:func:`estimate_memory` guesses the peak per rank the same way: the states of
:func:`end2end.plan.rules.memory_lower_bound` plus activations of ``34 x s x b x h`` bytes in
half precision per layer not checkpointed (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", without the attention scores that fused attention
does not keep; 24 of the 34 split by TP, all 34 under sequence parallelism), the input only
for a checkpointed layer, what the
``op`` policy keeps (:func:`end2end.plan.ckpt.activation_sbh`), the
micro-batches a pipeline stage keeps alive (all of them in the torch pipeline's GPipe order,
``min(M, PP)`` in DeepSpeed's 1F1B) and the fp32 logits. A candidate estimated not to fit is
simulated after those estimated to fit.
"""

from __future__ import annotations

from typing import Dict

from end2end.models import get_model_spec
from end2end.models.flops import train_flops_per_sample
from end2end.plan.cluster import Cluster
from end2end.plan.rules import (DTYPE_BYTES, parameter_count, shards_states_over_dp,
                                state_bytes_per_parameter)
from end2end.plan.ckpt import activation_sbh, ckpt_fraction
from end2end.plan.space import Candidate
from end2end.simulate.cost.timing import overlap_cost
from end2end.spec.modes import get_mode
from end2end.spec.runspec import DTYPES

__all__ = ["estimate_seconds", "estimate_throughput", "estimate_memory", "OPS_PER_LAYER"]

OPS_PER_LAYER = 120


def _ring_seconds(bytes_: float, group: int, bandwidth: float, factor: float) -> float:
    if group <= 1:
        return 0.0
    return factor * (group - 1) / group * bytes_ / bandwidth + 2 * group * 6e-6


def _dp_bandwidth(cand: Candidate, cluster: Cluster) -> float:
    """A DP group's bandwidth: NVLink inside a node, else the node's network share."""
    if cand.tp * cand.dp <= cluster.gpus_per_node:
        return cluster.nvlink_bytes_s
    per_node = max(1, cluster.gpus_per_node // cand.tp)  # ranks of one DP group on a node
    share = cluster.network_bytes_s * per_node / cluster.gpus_per_node
    return min(cluster.nvlink_bytes_s, share)


def estimate_seconds(cand: Candidate, cluster: Cluster) -> Dict[str, float]:
    """The step's estimated seconds by term (``compute``, ``tp``, ``dp``, ``bubble``,
    ``total``)."""
    spec = get_model_spec(cand.model)
    r = ckpt_fraction(cand.ckpt)
    dtype = DTYPES[cand.dtype]
    peak = cluster.peak_flops[dtype] * cluster.gemm_efficiency.get(dtype, 1.0)
    tokens = cand.micro * max(cand.seq, 1) / cand.tp
    rate = peak * tokens / (tokens + 512)
    flops = cand.batch * train_flops_per_sample(cand.model, cand.seq, cand.dec)
    compute = flops * (1 + r / 3) / (cluster.gpus * rate)
    b = DTYPE_BYTES[cand.dtype]
    layers = (spec.layers + spec.decoder_layers) / cand.pp
    act = cand.micro * cand.seq * spec.hidden * b
    tp = layers * cand.accumulation * (4 + 2 * r) * _ring_seconds(act, cand.tp,
                                                                  cluster.nvlink_bytes_s, 2)
    weights = parameter_count(spec) * b / (cand.tp * cand.pp)
    bandwidth = _dp_bandwidth(cand, cluster)
    if shards_states_over_dp(cand.mode, cand.pp):  # gathered and reduced every micro-batch
        dp = 3 * _ring_seconds(weights, cand.dp, bandwidth, 1) * (1 + r / 2) * cand.accumulation
    else:
        dp = _ring_seconds(weights, cand.dp, bandwidth, 2)
    dp_exposed = overlap_cost(dp, compute * 2 / 3, cluster.overlap_slowdown)
    host = layers * cand.accumulation * OPS_PER_LAYER * (1 + r / 3) * cluster.host_op_s
    compute = max(compute, host)
    bubble = (cand.pp - 1) / cand.accumulation * (compute + tp) if cand.pp > 1 else 0.0
    total = compute + tp + dp_exposed + bubble
    return dict(compute=compute, tp=tp, dp=dp_exposed, bubble=bubble, total=total)


def estimate_throughput(cand: Candidate, cluster: Cluster) -> float:
    """Estimated samples/s (:func:`estimate_seconds`)."""
    return cand.batch / estimate_seconds(cand, cluster)["total"]


def _in_flight(cand: Candidate) -> int:
    """Micro-batches whose activations a pipeline stage holds at once."""
    if cand.pp == 1:
        return 1
    if get_mode(cand.mode).framework == "deepspeed":  # DeepSpeed's 1F1B
        return min(cand.accumulation, cand.pp)
    return cand.accumulation


def estimate_memory(cand: Candidate, cluster: Cluster) -> float:
    """Estimated bytes a rank needs, as the simulator judges ``sim-oom`` (module docstring)."""
    spec = get_model_spec(cand.model)
    shards = cand.tp * cand.pp * (cand.dp if shards_states_over_dp(cand.mode, cand.pp) else 1)
    states = parameter_count(spec) * state_bytes_per_parameter(cand.mode, cand.dtype) / shards
    scale = DTYPE_BYTES[cand.dtype] / 2
    sbh = cand.micro * cand.seq * spec.hidden * scale
    per_layer = activation_sbh(cand.ckpt, cand.tp, cand.sequence_parallel) * sbh
    layers = (spec.layers + spec.decoder_layers) / cand.pp
    logits = cand.micro * cand.seq * spec.vocab * 4 / cand.tp
    peak = states + layers * per_layer * _in_flight(cand) + logits
    return peak * (1 + cluster.allocator_overhead) + cluster.reserved_bytes
