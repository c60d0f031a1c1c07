"""Shared pieces of the model schedules: each recipe is a few calls of these.

Every helper takes a schedule and module paths, so a recipe reads as "which path gets what":

* :func:`backbone` finds the backbone prefix (``bert``, ``transformer`` ...) or takes the knob;
* :func:`replace_attention` swaps a HF attention module for the op library's SDPA attention
  (:func:`slapo.op.attention_from_hf`, weights copied; on the meta device with ``delay_init``),
  and the other module replacements (:mod:`.replacements`, re-exported here);
* :func:`shard_attention`, :func:`shard_mlp`, :func:`shard_embedding`, :func:`shard_lm_head`:
  Megatron-style tensor parallelism (column-parallel entry, row-parallel exit, one all-reduce
  per region each way), or its sequence-parallel form (:class:`TPMode`);
  :func:`vocab_and_sequence_parallel` is the tail the decoder recipes share (vocab-parallel
  embedding and head, the sequence-parallel region);
* :func:`schedule_layers` runs a :class:`LayerPlan` over an encoder's or decoder's layers;
* :func:`checkpoint_layers` checkpoints exactly ``checkpoint_layer_ids(L, ratio)`` layers;
* :func:`cut_pipeline` cuts pipeline stages after layers (:mod:`.pipeline_cuts`, re-exported
  here with :func:`pipeline_cut_paths` and :func:`cut_pipeline_at`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from torch import nn

from ..errors import ConfigError
from ..schedule import Schedule
from ..sharding.sequence_parallel import (gather_sequence, mark_replicated,
                                          reduce_scatter_sequence)
from .config import ScheduleConfig, checkpoint_layer_ids
from .pipeline_cuts import cut_pipeline, cut_pipeline_at, pipeline_cut_paths
from .replacements import (RMS_NORMS, fast_dropout, fuse_rms_norms, native_gelu,
                           replace_attention, replace_mlp, replace_residual_norm)

__all__ = [
    "TPMode", "backbone", "join", "layer_paths", "disable_kv_cache", "tp_mode",
    "replace_attention", "replace_mlp", "replace_residual_norm", "native_gelu", "sdpa_masks",
    "column_parallel", "row_parallel", "shard_attention", "shard_mlp", "shard_embedding",
    "shard_lm_head", "sequence_parallel_region", "vocab_and_sequence_parallel", "LayerPlan",
    "pipeline_cut_paths", "cut_pipeline_at",
    "schedule_layers", "checkpoint_layers", "cut_pipeline", "fuse_rms_norms", "fast_dropout",
    "RMS_NORMS",
]


@dataclasses.dataclass(frozen=True)
class TPMode:
    """How a recipe parallelises: ``tp`` (tensor parallel, world size > 1) and ``sp`` (sequence
    parallel on top: activations between TP regions split along the sequence axis 1)."""

    tp: bool = False
    sp: bool = False


def join(*parts: str) -> str:
    """Dotted path from the non-empty ``parts``."""
    return ".".join(p for p in parts if p)


def backbone(sch: Schedule, cfg: ScheduleConfig, probe: str, candidates: Sequence[str],
             family: str) -> str:
    """The backbone prefix: ``cfg.prefix``, else the first of ``candidates`` (``""`` = the root)
    under which ``probe`` (e.g. ``"encoder.layer"``) exists."""
    options = [cfg.prefix] if cfg.prefix else list(candidates)
    for prefix in options:
        if join(prefix, probe) in sch:
            return prefix
    raise ConfigError(
        f"the {family} schedule cannot find '{probe}' under "
        + " or ".join(repr(p or "<root>") for p in options), call=f"apply_schedule({family!r})",
        hint=f"is this a {family} model? pass prefix=<path of the backbone> if it is wrapped")


def layer_paths(sch: Schedule, path: str) -> List[str]:
    """Paths of the items of the ``ModuleList``/``Sequential`` at ``path``."""
    return [join(path, name) for name in sch[path].child]


def _configs(sch: Schedule, model_config: Any) -> List[Any]:
    """``model_config`` and every distinct config held by the model's modules (T5's decoder
    stack has its own copy)."""
    configs = [model_config] + [getattr(m, "config", None) for m in sch.mod.modules()]
    return list({id(c): c for c in configs if c is not None}.values())


def disable_kv_cache(sch: Schedule, model_config: Any) -> None:
    """Training never uses the KV cache, and checkpointed layers must not append to it twice:
    set ``use_cache=False`` on every config of the model (:func:`_configs`).
    ``model(..., use_cache=True)`` still enables it for generation."""
    for config in _configs(sch, model_config):
        if hasattr(config, "use_cache"):
            config.use_cache = False


def sdpa_masks(sch: Schedule, model_config: Any) -> None:
    """Once every attention of the model is the op library's (SDPA), let HF build SDPA-style
    masks: ``None`` without padding, so causal layers take the kernels' causal fast path and
    GPT-Neo's local layers the block-by-block path, instead of an eager ``[B, 1, S, S]`` float
    mask that must be applied in full (HF's GPT-Neo has no SDPA attention, so its config says
    ``eager``). Sets ``_attn_implementation = "sdpa"`` on every config of the model."""
    for config in _configs(sch, model_config):
        if getattr(config, "_attn_implementation", "sdpa") == "eager":
            config._attn_implementation = "sdpa"


def tp_mode(sch: Schedule, cfg: ScheduleConfig, family: str) -> TPMode:
    """Validate the parallel knobs against the family and the group (sequence parallelism
    itself is checked by the registry, from what the recipe declares); returns the mode."""
    call = f"apply_schedule({family!r})"
    tp = sch.world_size > 1
    if tp and cfg.sequence_parallel and not cfg.shard_embedding:
        raise ConfigError("sequence_parallel needs the vocab-parallel embedding and LM head",
                          call=call, hint="drop shard_embedding=False, or sequence_parallel")
    if tp and cfg.attn_kernel == "eager" and family != "wideresnet":
        raise ConfigError(
            "attn_kernel='eager' keeps HF's attention, which this schedule does not shard",
            call=call, hint="use attn_kernel='auto' (the op library's attention is sharded by "
            "heads), or shard HF's attention yourself")
    return TPMode(tp=tp, sp=tp and cfg.sequence_parallel)


def _fused(fused: int) -> Dict[str, int]:
    """``shard``'s ``fused`` keyword, left out when 1 (the history shows only what matters)."""
    return {"fused": fused} if fused != 1 else {}


def column_parallel(sch: Schedule, mode: TPMode, *, grad_sync: bool = True,
                    fused: int = 1) -> None:
    """Shard a Linear (or HF Conv1D) column-wise: weight and bias on the output axis (with
    ``fused`` packed blocks, e.g. gate|up, a slice of each); the input gradient is then partial
    and all-reduced (``grad_sync``, not with sequence parallelism, where the gather before the
    region reduce-scatters it)."""
    names = ["weight"] + (["bias"] if getattr(sch.mod, "bias", None) is not None else [])
    sch.shard(names, axis=1 if _is_conv1d(sch.mod) else 0, **_fused(fused))
    if grad_sync and not mode.sp:
        sch.sync("bwd_post", "all_reduce")


def row_parallel(sch: Schedule, mode: TPMode, *, fused: int = 1) -> None:
    """Shard a Linear (or HF Conv1D) row-wise (with ``fused`` packed blocks, a slice of each)
    and reduce its partial output (all-reduce, or reduce-scatter along the sequence with
    sequence parallelism); the bias is added once."""
    sch.shard("weight", axis=0 if _is_conv1d(sch.mod) else 1, **_fused(fused))
    if mode.sp:
        reduce_scatter_sequence(sch)
    else:
        sch.sync("fwd_post", "all_reduce")


def _is_conv1d(mod: nn.Module) -> bool:
    from ..sharding.rules import is_hf_conv1d

    return is_hf_conv1d(mod)


def shard_attention(sch: Schedule, path: str, mode: TPMode) -> None:
    """Shard the op library's attention at ``path`` by heads: q/k/v (or the fused ``qkv_proj``,
    whose grouped layout gives whole heads) column-parallel, ``out_proj`` row-parallel, a T5
    relative position bias on its head axis; the head counts become per-rank. The input
    gradient of each projection is all-reduced (not the module's input: ALBERT's attention also
    adds its input as the residual)."""
    node = sch[path]
    attn, ws = node.mod, sch.world_size
    if attn.num_kv_heads % ws:
        raise ConfigError(
            f"'{path}' has {attn.num_kv_heads} key/value heads, which cannot be split over "
            f"{ws} tensor-parallel ranks", call="apply_schedule",
            hint=f"use a tensor-parallel size that divides {attn.num_kv_heads}")
    projections = ["qkv_proj"] if attn.fused_qkv else ["q_proj", "k_proj", "v_proj"]
    for name in projections:
        column_parallel(node[name], mode)
    if getattr(attn, "relative_attention_bias", None) is not None:
        node["relative_attention_bias"].shard("weight", axis=1)
    if attn.out_proj is not None:
        row_parallel(node["out_proj"], mode)
    attn.num_heads //= ws
    attn.num_kv_heads //= ws
    if attn.attn_op.dropout > 0:  # this rank's heads draw their own dropout masks
        node["attn_op"].fork_rng()


def shard_mlp(sch: Schedule, column: Sequence[str], row: str, mode: TPMode, *,
              grad_entry: Optional[str] = None) -> None:
    """Column-parallel ``column`` projections, row-parallel ``row``. The input gradient is
    all-reduced once on ``grad_entry`` (a module whose first input feeds every column
    projection, e.g. LLaMA's ``mlp`` for gate and up), else after each column projection."""
    for path in column:
        column_parallel(sch[path], mode, grad_sync=grad_entry is None)
    if grad_entry is not None and not mode.sp:
        sch[grad_entry].sync("bwd_post", "all_reduce")
    row_parallel(sch[row], mode)


def shard_embedding(sch: Schedule, paths: Sequence[str]) -> None:
    """Vocab-parallel word embedding(s) (tied copies share the shard) with the partial lookup
    all-reduced after each module that is called."""
    sch[paths[0]].shard("weight", axis=0)
    seen = set()
    for path in paths:
        if id(sch[path].mod) not in seen:  # a module reachable by two paths is hooked once
            seen.add(id(sch[path].mod))
            sch[path].sync("fwd_post", "all_reduce")


def shard_lm_head(sch: Schedule, path: str, mode: TPMode, cfg: ScheduleConfig, *,
                  loss: str) -> None:
    """Vocab-parallel LM head (tied to the embedding or not) and the model's loss over its
    vocab-sharded logits: ``loss="causal"`` sets the model's ``loss_function`` to
    :class:`slapo.op.cross_entropy.VocabParallelCausalLMLoss` (``"masked_function"``: to
    :class:`~slapo.op.cross_entropy.VocabParallelMaskedLMLoss`, for models whose forward calls
    a ``loss_function`` that HF resolves to ``ForMaskedLMLoss``); ``"masked"`` / ``"seq2seq"``
    (models whose forward computes a plain cross-entropy on full logits itself) wrap the model's
    forward in :class:`slapo.op.lm_loss.VocabParallelLMLoss`. No full-vocabulary tensor is built;
    the outputs' logits are this rank's shard. With ``cfg.vocab_parallel_loss=False``, and for
    masked/seq2seq models cut into pipeline stages, the logits are all-gathered instead and the
    model's own loss runs on them (always with ``loss="gather"``)."""
    from ..op.cross_entropy import VocabParallelCausalLMLoss, VocabParallelMaskedLMLoss
    from ..op.lm_loss import VocabParallelLMLoss
    from ..runtime.forward_wrap import install_forward_wrapper

    node = sch[path]
    names = ["weight"] + (["bias"] if getattr(node.mod, "bias", None) is not None else [])
    node.shard(names, axis=0)
    if not mode.sp:
        node.sync("bwd_post", "all_reduce")
    if loss == "gather" or not cfg.vocab_parallel_loss or (
            loss in ("masked", "seq2seq") and cfg.pipeline_cuts):
        node.sync("fwd_post", "all_gather", axis=-1)
        return
    if loss == "causal":
        sch.root.mod.loss_function = VocabParallelCausalLMLoss(sch.group)
    elif loss == "masked_function":
        sch.root.mod.loss_function = VocabParallelMaskedLMLoss(sch.group)
    else:
        install_forward_wrapper(sch.root.mod, "vocab_parallel_loss",
                                VocabParallelLMLoss(loss, sch.group))
    sch.root.metadata["vocab_parallel_loss"] = loss


def sequence_parallel_region(sch: Schedule, first_layer: str, norms: Sequence[str],
                             final_norm: str) -> None:
    """Sequence parallelism around the TP regions: split the first layer's input along the
    sequence, all-gather after every norm that feeds a TP region (backward reduce-scatters the
    partial gradient) and after the final norm (which feeds the vocab-parallel head); norm
    parameters see only a sequence chunk, so they are marked replicated (gradients summed over
    the TP group in backward by the ``all_reduce_grads`` hooks of ``mark_replicated``)."""
    sch[first_layer].sync("fwd_pre", "scatter", axis=1)
    for path in [*norms, final_norm]:
        gather_sequence(sch[path])
        mark_replicated(sch[path])


def vocab_and_sequence_parallel(sch: Schedule, cfg: ScheduleConfig, mode: TPMode, *,
                                embedding: Union[None, str, Sequence[str]],
                                lm_head: Optional[str], layers: Sequence[str],
                                norms: Sequence[str], final_norm: str,
                                loss: str = "causal") -> None:
    """The tail of a decoder recipe: under TP with ``cfg.shard_embedding``, the vocab-parallel
    ``embedding`` (a path, or tied paths sharing one weight: :func:`shard_embedding`) and
    ``lm_head`` with the vocab-parallel ``loss`` (:func:`shard_lm_head`; either may be ``None``
    or empty: absent or kept whole); with sequence
    parallelism, the region around the decoder ``layers``, gathered after each layer's
    ``norms`` (names relative to a layer) and after ``final_norm``
    (:func:`sequence_parallel_region`)."""
    if mode.tp and cfg.shard_embedding:
        embeddings = [embedding] if isinstance(embedding, str) else list(embedding or [])
        if embeddings:
            shard_embedding(sch, embeddings)
        if lm_head is not None:
            shard_lm_head(sch, lm_head, mode, cfg, loss=loss)
    if mode.sp:
        per_layer = [join(layer, name) for layer in layers for name in norms]
        sequence_parallel_region(sch, layers[0], per_layer, final_norm)


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """Where the pieces of one transformer layer are, relative to the layer's path.

    ``attn``: the HF attention module (replaced by the op library's); ``attn_out``: a separate
    output projection (BERT's ``attention.output.dense``); ``column``/``row``: the MLP's
    column-/row-parallel projections; ``grad_entry``: a module whose first input feeds all of
    ``column`` (one gradient all-reduce instead of one per projection); ``mlp``: the MLP module
    replaced for bias+GeLU fusion; ``act``: the MLP's activation (a HF GeLU written as Python
    element-wise ops becomes ``nn.GELU``, :func:`native_gelu`); ``norms``: the norms feeding
    the attention and the MLP (sequence parallelism gathers after them).
    """

    attn: str
    column: Tuple[str, ...]
    row: str
    attn_out: Optional[str] = None
    grad_entry: Optional[str] = None
    mlp: Optional[str] = None
    act: Optional[str] = None
    norms: Tuple[str, ...] = ()


def schedule_layers(sch: Schedule, cfg: ScheduleConfig, mode: TPMode, layers: Sequence[str],
                    plan: LayerPlan, *, fused_qkv: Optional[bool] = None,
                    fuse_bias_gelu: Any = False) -> None:
    """Per layer: replace the attention (``fused_qkv`` default: ``cfg.fuse``), optionally fuse
    bias+GeLU in the MLP, and with TP shard attention and MLP (:class:`LayerPlan`)."""
    from ..op.mlp import MLP

    fused_qkv = cfg.fuse if fused_qkv is None else fused_qkv
    for layer in layers:
        attn = join(layer, plan.attn)
        replace_attention(sch, attn, cfg, fused_qkv=fused_qkv)
        column, row = [join(layer, c) for c in plan.column], join(layer, plan.row)
        if plan.mlp is not None and replace_mlp(sch, join(layer, plan.mlp), cfg, fuse_bias_gelu) \
                and isinstance(sch[join(layer, plan.mlp)].mod, MLP):
            column, row = [join(layer, plan.mlp, "fc_in")], join(layer, plan.mlp, "fc_out")
        elif plan.act is not None:
            native_gelu(sch, join(layer, plan.act))
        if not mode.tp:
            continue
        shard_attention(sch, attn, mode)
        if plan.attn_out is not None:
            row_parallel(sch[join(layer, plan.attn_out)], mode)
        entry = join(layer, plan.grad_entry) if plan.grad_entry else None
        shard_mlp(sch, column, row, mode, grad_entry=entry)


def checkpoint_layers(sch: Schedule, paths: Sequence[str], ratio: float,
                      policy: Any = "") -> List[int]:
    """Checkpoint exactly the layers ``checkpoint_layer_ids(len(paths), ratio)`` (with the
    selective ``policy`` when given: ``ScheduleConfig.ckpt_policy``); returns them."""
    ids = checkpoint_layer_ids(len(paths), ratio)
    selective = {"policy": policy} if policy else {}
    for i in ids:
        sch[paths[i]].checkpoint(**selective)
    return ids
