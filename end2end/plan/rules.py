"""Rules that prune a candidate before anything is simulated: divisibility and a memory lower
bound per rank.

**Divisibility**: tensor parallelism splits attention heads, key/value heads, the FFN and the
(padded) vocabulary, so TP must divide each; a pipeline cuts the layers into equal stages, so
PP must divide the layer count; TP stays inside one node (its collectives are on the critical
path of every layer: across nodes they would run at the network's speed).

**Memory lower bound**: what a rank must hold whatever the runtime does, from the parameter
count ``P`` (:func:`parameter_count`, embeddings counted once) and the run's dtype:

* states per parameter: the modes that keep fp32 masters (``Mode.mixed_precision``: DeepSpeed,
  FSDP2, megatron; and every mode in fp32) ``4 + 8`` bytes (master or weight, AdamW's two
  moments) plus the low-precision weight and gradient (``2 + 2``) in fp16/bf16, ``4`` more for
  the fp32 gradient in fp32; the others (``eager``, ``slapo``: the model cast to the dtype)
  ``4 x`` the dtype's bytes (weight, gradient, two moments);
* sharded by TP x PP for every mode (a rank holds at least its share of the largest stage),
  and by DP as well under ZeRO-3 and FSDP (``deepspeed``, ``slapo-deepspeed`` without a
  pipeline, ``fsdp``, ``slapo-fsdp``); DDP and megatron's optimizer replicate over DP;
* activations: at least every layer's input of one micro-batch (``micro x seq x hidden`` in
  the dtype) per layer of the stage, twice that for a layer that is not checkpointed; a TP-th
  of that under sequence parallelism (each TP rank holds its sequence chunk).

The bound x (1 + the profile's allocator overhead) + its reserved bytes, as the simulator
judges ``sim-oom``, above the device's memory prunes the candidate. Being a lower bound it
never prunes a candidate the simulator would predict to fit.
"""

from __future__ import annotations

from typing import List, Optional

from end2end.models import ModelSpec
from end2end.spec.modes import get_mode

__all__ = ["parameter_count", "state_bytes_per_parameter", "shards_states_over_dp",
           "memory_lower_bound", "divisibility_problem", "mode_problem", "DTYPE_BYTES",
           "MEGATRON_FAMILIES"]

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
#: The families megatron-core's own model is built for (the model types of
#: ``end2end.driver.baselines.megatron_core.family_of``; a test keeps the two equal).
MEGATRON_FAMILIES = ("gpt2", "gpt_neo", "bert", "roberta", "t5", "llama", "mistral")


def mode_problem(spec: ModelSpec, mode: str) -> Optional[str]:
    """Why ``mode`` cannot train the model at all, or ``None``."""
    if get_mode(mode).builds_own_model and spec.family not in MEGATRON_FAMILIES:
        return f"megatron-core has no {spec.family} model"
    if spec.is_vision and get_mode(mode).framework == "megatron":
        return "megatron trains transformers only"
    return None


def parameter_count(spec: ModelSpec) -> float:
    """Parameters of a transformer (attention, FFN or experts, one embedding); 0 for
    WideResNet (no bound)."""
    if spec.is_vision or not spec.hidden:
        return 0.0
    h = spec.hidden
    attention = 2 * h * spec.attn_dim + 2 * h * spec.kv_dim
    ffn = (3 if spec.gated_ffn else 2) * h * spec.ffn * max(1, spec.experts)
    layers = spec.layers + spec.decoder_layers
    cross = spec.decoder_layers * attention  # T5's decoder attends to the encoder too
    return float(layers * (attention + ffn) + cross + spec.vocab * spec.emb_dim)


def state_bytes_per_parameter(mode: str, dtype: str) -> float:
    """Bytes of weights, gradients and AdamW states per parameter (module docstring)."""
    b = DTYPE_BYTES[dtype]
    if get_mode(mode).mixed_precision or b == 4:
        return 16.0  # 4 + 8 + 2 + 2 in fp16/bf16; 4 + 8 + 4 (fp32 gradient) in fp32
    return 4.0 * b


def shards_states_over_dp(mode: str, pp: int) -> bool:
    """Whether the mode divides weights, gradients and optimizer states by DP (ZeRO-3, FSDP2)."""
    return get_mode(mode).framework == "fsdp" or (get_mode(mode).framework == "deepspeed"
                                                  and pp == 1)


def memory_lower_bound(spec: ModelSpec, mode: str, dtype: str, tp: int, pp: int, dp: int,
                       micro: int, seq: int, ckpt_ratio: float,
                       sequence_parallel: bool = False) -> float:
    """The bytes a rank holds at least (module docstring)."""
    shards = tp * pp * (dp if shards_states_over_dp(mode, pp) else 1)
    states = parameter_count(spec) * state_bytes_per_parameter(mode, dtype) / shards
    if spec.is_vision:
        return states
    layers = (spec.layers + spec.decoder_layers) / pp
    per_layer = micro * seq * spec.hidden * DTYPE_BYTES[dtype] / (tp if sequence_parallel else 1)
    return states + layers * per_layer * (ckpt_ratio + 2 * (1 - ckpt_ratio))


def divisibility_problem(spec: ModelSpec, tp: int, pp: int, gpus_per_node: int
                         ) -> Optional[str]:
    """Why ``tp`` x ``pp`` cannot split the model (a short reason), or ``None``."""
    if tp > gpus_per_node:
        return f"tp {tp} > {gpus_per_node} GPUs per node"
    if spec.is_vision:
        return "tp/pp of a vision model" if tp * pp > 1 else None
    sizes: List[tuple] = [("heads", spec.heads), ("kv heads", spec.kv_heads or spec.heads),
                          ("ffn", spec.ffn), ("vocab", spec.vocab)]
    for what, size in sizes:
        if tp > 1 and size % tp:
            return f"tp {tp} does not divide {what} {size}"
    stacks = [spec.layers] + ([spec.decoder_layers] if spec.decoder_layers else [])
    if pp > 1 and any(n % pp for n in stacks):
        return f"pp {pp} does not divide layers {'/'.join(map(str, stacks))}"
    return None
