"""``apply_schedule(model, "auto")``: a schedule derived from the model's own tensor-parallel plan.

Any transformers 5 causal LM whose config declares ``base_model_tp_plan`` (164 families) gets:

1. the plan entries as Slapo primitives (:mod:`slapo.model_schedule.tp_plan`: every style, one
   class each, either becomes ``shard``/``sync``/``all_reduce_grads`` calls or is refused with
   a ``ConfigError`` naming the entry; mixture-of-experts entries go to
   :mod:`slapo.model_schedule.moe`);
2. what Slapo adds on top:

   * the op library's SDPA attention (:func:`slapo.op.attention_from_hf`) for the attention
     classes it covers exactly (:data:`OP_ATTENTION`, e.g. LLaMA's), sharded by heads
     (``common.shard_attention``) instead of the plan's q/k/v/o entries; other attentions stay
     HF's, sharded by the plan (HF 5 attentions reshape with ``-1`` heads);
   * the op library's one-function RMSNorm for every ``*RMSNorm`` it reproduces (checked on a
     probe input at schedule time; Gemma's ``1 + weight`` norms are kept), with ``fuse``;
   * a vocab-parallel embedding and LM head (tied or not) with the vocab-parallel causal loss,
     with ``shard_embedding`` (the plan's ``embed_tokens``/``lm_head`` entries are replaced by
     it; with the knob off both stay whole), and the sequence-parallel region: the tail the
     hand-written decoder recipes share (``common.vocab_and_sequence_parallel``);
   * ``ckpt_ratio`` over the decoder layers, ``pipeline_cuts`` (needs ``example_inputs``), KV
     cache off, ``sequence_parallel`` for LLaMA-shaped layers (refused otherwise);
3. a report of the modules the plan leaves whole (``warnings.warn`` and
   ``sch.metadata["tp_plan_unsharded"]``, shown by ``explain``).

Knobs: every ``ScheduleConfig`` field, plus ``example_inputs`` (for pipeline cuts) and
``expert_parallel`` (MoE: whole experts per rank instead of a slice of every expert).
"""

from __future__ import annotations

import copy
from typing import Any, List, Optional, Sequence, Set, Tuple

import torch
from torch import nn

from ..errors import ConfigError
from ..schedule import Schedule
from . import common as C
from . import tp_plan as P
from .config import ScheduleConfig
from .registry import register_model_schedule

__all__ = ["schedule_auto", "OP_ATTENTION", "fuse_matching_rms_norms", "decoder_layers"]

# HF attention classes whose forward the op library's adapter reproduces exactly (same
# projections, RoPE from ``position_embeddings``, GQA, causal, no sliding window, no q/k norm).
OP_ATTENTION = ("LlamaAttention",)
_CALL = "apply_schedule('auto')"


def _path_of(sch: Schedule, mod: Optional[nn.Module]) -> Optional[str]:
    if mod is None:
        return None
    return next((path for path, m in sch.mod.named_modules() if m is mod), None)


def decoder_layers(sch: Schedule, entries: Sequence[P.PlanEntry]) -> List[str]:
    """Paths of the decoder layers: the ``ModuleList`` the plan's ``*`` globs run over."""
    for entry in entries:
        head, sep, _ = entry.glob.partition(".*.")
        if sep and head in sch and isinstance(sch[head].mod, nn.ModuleList):
            return C.layer_paths(sch, head)
    return []


def _tp_mode(sch: Schedule, cfg: ScheduleConfig) -> C.TPMode:
    tp = sch.world_size > 1
    if tp and cfg.sequence_parallel and not cfg.shard_embedding:
        raise ConfigError("sequence_parallel needs the vocab-parallel embedding and LM head",
                          call=_CALL, hint="drop shard_embedding=False, or sequence_parallel")
    return C.TPMode(tp=tp, sp=tp and cfg.sequence_parallel)


def _replace_attentions(sch: Schedule, cfg: ScheduleConfig, mode: C.TPMode,
                        entries: List[P.PlanEntry]) -> List[P.PlanEntry]:
    """Replace every plan-covered attention of a class in :data:`OP_ATTENTION` whose plan is
    exactly q/k/v colwise + o rowwise by the op library's (sharded by heads under TP); returns
    the entries left to the plan."""
    if cfg.attn_kernel == "eager":
        return entries
    expected = {"q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise",
                "o_proj": "rowwise"}
    parents = {e.path.rpartition(".")[0] for e in entries if e.param is None}
    replaced: Set[str] = set()
    for path in sorted(parents):
        if path not in sch or type(sch[path].mod).__name__ not in OP_ATTENTION:
            continue
        below = {e.target[len(path) + 1:]: e.style for e in entries
                 if e.target.startswith(path + ".")}
        if below != expected:
            continue
        C.replace_attention(sch, path, cfg)
        if mode.tp:
            C.shard_attention(sch, path, mode)
        replaced.add(path)
    return [e for e in entries if e.path.rpartition(".")[0] not in replaced]


def _vocab_paths(sch: Schedule, entries: Sequence[P.PlanEntry]
                 ) -> Tuple[Optional[str], Optional[str]]:
    """The input embedding and the LM head that become vocab-parallel (the latter with the
    vocab-parallel causal loss) under TP with ``shard_embedding``; ``None`` for one that is
    absent, not plain, or kept whole by the plan. Their plan entries are replaced by this."""
    model = sch.mod
    emb = _path_of(sch, model.get_input_embeddings()) if hasattr(
        model, "get_input_embeddings") else None
    head = _path_of(sch, model.get_output_embeddings()) if hasattr(
        model, "get_output_embeddings") else None
    # the plan's own word wins where it keeps the module whole (Inkling2's normed embedding)
    whole = {e.path for e in entries if P.STYLES[e.style].keeps_whole and e.param is None}
    emb_mod = sch[emb].mod if emb is not None else None
    emb = emb if emb not in whole and P.plain_embedding(emb_mod) else None
    head_mod = sch[head].mod if head is not None else None
    tied_to_whole = emb is None and emb_mod is not None and getattr(
        head_mod, "weight", None) is getattr(emb_mod, "weight", False)
    head = head if head not in whole and isinstance(head_mod, nn.Linear) and P.plain_linear(
        head_mod) and not tied_to_whole else None
    return emb, head


def _rms_norm_matches(mod: nn.Module, new: nn.Module) -> bool:
    """Whether the op library's RMSNorm ``new`` computes what ``mod`` does, on a probe input
    and a random weight (an all-ones or all-zeros init would hide ``1 + weight`` norms)."""
    probe_mod, probe_new = copy.deepcopy(mod), copy.deepcopy(new)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        weight = torch.randn(mod.weight.shape, generator=gen).to(mod.weight)
        probe_mod.weight.copy_(weight)
        probe_new.weight.copy_(weight)
        x = torch.randn(3, mod.weight.shape[-1], generator=gen).to(mod.weight)
        try:
            return torch.allclose(probe_mod(x), probe_new(x), rtol=1e-5, atol=1e-6)
        except (RuntimeError, TypeError):
            return False


def fuse_matching_rms_norms(sch: Schedule) -> List[str]:
    """Replace every module named ``*RMSNorm`` (with ``weight`` and ``variance_epsilon``)
    that the op library's :class:`slapo.op.rms_norm.RMSNorm` reproduces; returns the paths."""
    from ..op.rms_norm import RMSNorm

    done: List[str] = []
    verdict = {}
    for path, mod in list(sch.mod.named_modules()):
        name = type(mod).__name__
        if not (name.endswith("RMSNorm") and hasattr(mod, "variance_epsilon")
                and isinstance(getattr(mod, "weight", None), nn.Parameter)):
            continue
        new = RMSNorm.from_hf(mod)
        if name not in verdict:
            verdict[name] = _rms_norm_matches(mod, new)
        if verdict[name]:
            sch[path].replace(new)
            done.append(path)
    return done


SP_NORMS = ("input_layernorm", "post_attention_layernorm")


def _check_sequence_parallel(sch: Schedule, layers: Sequence[str],
                             entries: Sequence[P.PlanEntry], norm: str) -> None:
    """Sequence parallelism fits LLaMA-shaped layers (:data:`SP_NORMS` feeding the TP regions,
    a final ``norm``) whose plan has only ``colwise``/``rowwise``/replicated entries.

    Raises:
        ConfigError: naming what does not fit.
    """
    shape_ok = bool(layers) and norm in sch and all(
        f"{layer}.{n}" in sch for layer in layers for n in SP_NORMS)
    plain = (P.Colwise(), P.Rowwise())
    bad = [e for e in entries
           if P.STYLES[e.style] not in plain and not P.STYLES[e.style].keeps_whole]
    if not shape_ok or bad:
        why = (f"plan entry '{bad[0].glob}: {bad[0].style}' gathers or splits activations"
               if bad else "the layers are not LLaMA-shaped (input_layernorm, "
               "post_attention_layernorm, a final norm)")
        raise ConfigError(f"sequence_parallel is not supported for this model: {why}",
                          call=_CALL, hint="drop sequence_parallel=True")


@register_model_schedule("auto", extra_knobs=("example_inputs", "expert_parallel"))
def schedule_auto(sch: Schedule, model_config: Any, cfg: ScheduleConfig,
                  example_inputs: Any = None, expert_parallel: bool = False) -> None:
    """A schedule from the model's own tensor-parallel plan; see the module docs.

    Raises:
        ConfigError: the model declares no plan; a plan entry Slapo cannot honour (naming the
            entry and why); heads the TP size does not divide; sequence parallelism on layers
            it does not fit; bad pipeline cuts.
    """
    plan = P.read_plan(sch.mod)
    if not plan:
        raise ConfigError(f"{type(sch.mod).__name__} declares no tensor-parallel plan "
                          "(its config class has no base_model_tp_plan)", call=_CALL,
                          hint="use a model schedule written for the family, or write one")
    entries = P.resolve_plan(sch.mod, plan)
    P.check_styles(entries)
    mode = _tp_mode(sch, cfg)
    C.disable_kv_cache(sch, model_config)
    layers = decoder_layers(sch, entries)
    base = entries[0].glob.partition(".*.")[0].rpartition(".")[0] if entries else ""
    entries = _replace_attentions(sch, cfg, mode, entries)
    emb, head = _vocab_paths(sch, entries)
    entries = [e for e in entries if e.path not in (emb, head)]
    if cfg.fuse:  # before the plan: its hooks go on the modules that stay
        fuse_matching_rms_norms(sch)
    ctx = P.apply_plan(sch, entries, cfg, mode, expert_parallel=expert_parallel)
    if mode.sp:
        _check_sequence_parallel(sch, layers, entries, C.join(base, "norm"))
    C.vocab_and_sequence_parallel(sch, cfg, mode, embedding=emb, lm_head=head, layers=layers,
                                  norms=SP_NORMS, final_norm=C.join(base, "norm"))
    P.report_unsharded(sch, ctx.handled)
    C.checkpoint_layers(sch, layers, cfg.ckpt_ratio)
    C.cut_pipeline(sch, cfg, [layers] if layers else [], "auto", example_inputs)
