"""``apply_schedule(model, "auto")``: a schedule derived from the model's own tensor-parallel plan.

Any transformers 5 model whose plan transformers can resolve (``model._tp_plan``: the config's
``base_model_tp_plan`` and the sub-configs', e.g. the text model of a vision-language model,
under the real module paths) gets, in three phases:

* **plan**: the plan read as transformers resolves it (:func:`slapo.model_schedule.tp_plan.
  read_plan`), every glob expanded over the model's paths; an entry whose fixed prefix names no
  module is refused (it would leave its part silently whole), and so is, under tensor
  parallelism, a plan whose entries match nothing under a layer list it would leave mostly
  whole (``tp_plan.check_coverage``: a renamed attention or MLP inside the layers);
* **check** (nothing has changed yet; a refused model is exactly the model passed in): every
  style and the module it names, head and kv-head counts, unnamed parameters inside TP
  regions, experts and routers (``tp_plan.check_plan``), the vocab-parallel embedding(s) and
  head and the loss they need (:mod:`.auto_checks`: from the head the model really has, not
  the family), sequence parallelism by the layers' dataflow, pipeline cuts;
* **apply**:

  1. the plan entries as Slapo primitives (:mod:`slapo.model_schedule.tp_plan`; experts
     through :mod:`slapo.model_schedule.moe`);
  2. what Slapo adds on top: the op library's SDPA attention (:func:`slapo.op.attention_from_hf`)
     for the attention classes it covers exactly (:data:`OP_ATTENTION`), sharded by heads
     instead of by the plan's q/k/v/o entries; the op library's RMSNorm for every ``*RMSNorm`` it
     reproduces (checked on a probe input; Gemma's ``1 + weight`` norms are kept), with
     ``fuse``; a vocab-parallel embedding (with every embedding tied to it or to the head) and
     LM head with the vocab-parallel loss of that head (``auto_checks.head_loss``: causal,
     masked, or the model's own on gathered logits; ``sch.metadata["auto_loss"]``), with
     ``shard_embedding``; ``ckpt_ratio``, ``pipeline_cuts`` (needs ``example_inputs``), KV
     cache off, ``sequence_parallel`` where the dataflow is LLaMA's;
  3. a report of the modules the plan leaves whole (``warnings.warn`` and
     ``sch.metadata["tp_plan_unsharded"]``, shown by ``explain``).

Knobs: every ``ScheduleConfig`` field, plus ``example_inputs`` (for pipeline cuts) and
``expert_parallel`` (MoE: whole experts per rank instead of a slice of every expert).
"""

from __future__ import annotations

import copy
from typing import Any, List, Sequence

import torch
from torch import nn

from ..errors import ConfigError
from ..schedule import Schedule
from . import auto_checks as A
from . import common as C
from . import tp_plan as P
from .config import ScheduleConfig
from .registry import register_model_schedule

__all__ = ["schedule_auto", "OP_ATTENTION", "fuse_matching_rms_norms", "decoder_layers",
           "attentions_to_replace"]

# HF attention classes whose forward the op library's adapter reproduces exactly (same
# projections, RoPE from ``position_embeddings``, GQA, causal, no sliding window, no q/k norm).
OP_ATTENTION = ("LlamaAttention",)
_CALL = "apply_schedule('auto')"


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


def attentions_to_replace(sch: Schedule, cfg: ScheduleConfig,
                          entries: Sequence[P.PlanEntry]) -> List[str]:
    """The plan-covered attentions of a class in :data:`OP_ATTENTION` whose plan is exactly
    q/k/v colwise + o rowwise: the op library's attention replaces them (sharded by heads
    under TP). Changes nothing."""
    if cfg.attn_kernel == "eager":
        return []
    expected = {"q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise",
                "o_proj": "rowwise"}
    parents = {e.path.rpartition(".")[0] for e in entries if e.param is None}
    chosen: List[str] = []
    for path in sorted(parents):
        if path not in sch or type(sch[path].mod).__name__ not in OP_ATTENTION:
            continue
        below = {e.target[len(path) + 1:]: e.style for e in entries
                 if e.target.startswith(path + ".")}
        if below == expected:
            chosen.append(path)
    return chosen


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


@register_model_schedule("auto", extra_knobs=("example_inputs", "expert_parallel"),
                         sequence_parallel=None)
def schedule_auto(sch: Schedule, model_config: Any, cfg: ScheduleConfig,
                  example_inputs: Any = None, expert_parallel: bool = False) -> None:
    """A schedule from the model's own tensor-parallel plan; see the module docs. Every check
    runs before the first change: a refused model is left exactly as it was.

    Raises:
        ConfigError: the model declares no plan; a plan entry that matches no module path, or
            that Slapo cannot honour (naming the entry and why); heads the TP size does not
            divide; sequence parallelism on layers whose dataflow it does not fit; bad
            pipeline cuts.
    """
    # plan
    plan = P.read_plan(sch.mod)
    if not plan:
        raise ConfigError(f"{type(sch.mod).__name__} declares no tensor-parallel plan "
                          "(its config class has no base_model_tp_plan)", call=_CALL,
                          hint="use a model schedule written for the family, or write one")
    P.check_plan_paths(sch.mod, plan)
    entries = P.resolve_plan(sch.mod, plan)
    mode = _tp_mode(sch, cfg)
    layers = decoder_layers(sch, entries)
    base = entries[0].glob.partition(".*.")[0].rpartition(".")[0] if entries else ""
    final_norm = C.join(base, "norm")
    # check (nothing has changed yet)
    if mode.tp:
        P.check_coverage(sch.mod, plan, entries)
    P.check_plan(sch, entries, cfg, mode, expert_parallel=expert_parallel)
    attentions = attentions_to_replace(sch, cfg, entries)  # kv heads: check_plan's
    rest = [e for e in entries if e.path.rpartition(".")[0] not in attentions]
    embeddings, head, keep_whole = A.vocab_modules(sch, rest)
    loss = A.head_loss(sch) if head is not None else "gather"
    rest = [e for e in rest if e.path not in (*embeddings, head, *keep_whole)]
    if mode.sp:
        A.check_sequence_parallel(sch, layers, [e for e in entries if e.path not in (
            *embeddings, head)], final_norm)
    cuts = C.pipeline_cut_paths(sch, cfg, [layers] if layers else [], "auto", example_inputs)
    # apply
    C.disable_kv_cache(sch, model_config)
    for path in attentions:
        C.replace_attention(sch, path, cfg)
        if mode.tp:
            C.shard_attention(sch, path, mode)
    if cfg.fuse:  # before the plan: its hooks go on the modules that stay
        fuse_matching_rms_norms(sch)
    ctx = P.apply_plan(sch, rest, cfg, mode, expert_parallel=expert_parallel)
    C.vocab_and_sequence_parallel(
        sch, cfg, mode, embedding=embeddings, lm_head=head, layers=layers, norms=A.SP_NORMS,
        final_norm=final_norm, loss="masked_function" if loss == "masked" else loss)
    sch.metadata["auto_loss"] = loss if mode.tp and head is not None else "model"
    P.report_unsharded(sch, ctx.handled)
    C.checkpoint_layers(sch, layers, cfg.ckpt_ratio, cfg.ckpt_policy)
    C.cut_pipeline_at(sch, cuts, example_inputs)
