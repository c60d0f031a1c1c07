"""The ``dtensor-tp`` baseline: PyTorch's own tensor parallelism (DTensor ``parallelize_module``)
on the unmodified HuggingFace model, one plan per model family, written the way torchtitan writes
its plans: a dict from module path to a ``ParallelStyle``.

Per transformer layer: the attention's query/key/value projections ``ColwiseParallel`` (heads
split over the ranks), its output projection ``RowwiseParallel`` (one all-reduce), the MLP's first
linear(s) ``ColwiseParallel`` and its last ``RowwiseParallel``. The word embedding is
vocab-parallel (``RowwiseParallel`` on an ``nn.Embedding``: rows = vocabulary), and the LM head,
tied to it, column-parallel with the logits left vocab-sharded (a ``DTensor``) so the loss runs
under ``loss_parallel()`` without gathering them (:func:`parallel_loss`). T5's relative-position
bias table is split by heads like the attention. HF attention modules that reshape with their
*global* head count get the local count (``num_heads``/``n_heads`` divided by the TP size), which
is what a head-split plan needs from model code (torchtitan's models use ``-1`` instead).

Not supported (the run is a ``fail`` row that says why): GPT-2 (HF ``Conv1D`` layers, which the
DTensor styles do not cover: they shard ``nn.Linear``/``nn.Embedding``), ALBERT (one shared layer
module called for every layer; no plan written) and WideResNet (convolutions).
Sequence parallelism where the family allows it (pre-norm layers whose attention and MLP are
modules of their own: LLaMA, GPT-Neo; :data:`SP_LAYOUTS`), as torchtitan: the first layer's input
is split along the sequence (the embedding stays whole, so HF's masks and positions see the full
sequence), the norms run ``SequenceParallel``, the attention and MLP modules all-gather their
input (``PrepareModuleInput``), the row-parallel projections reduce-scatter back to sequence
shards, and the LM head gathers the final norm's output. BERT/RoBERTa (post-norm inside the
sub-layers), OPT (MLP linears called from the layer) and T5 run without it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Tuple

from torch import nn

from slapo.errors import ConfigError

__all__ = ["FAMILY_LAYOUTS", "tp_plan", "apply_tp_plan", "parallel_loss"]

# family -> (layer stack, attention path in a layer, (column-parallel projections), row-parallel
# attention output, (column-parallel MLP inputs), row-parallel MLP output, head-count attributes)
FAMILY_LAYOUTS: Dict[str, Tuple[str, str, Tuple[str, ...], str, Tuple[str, ...], str,
                                Tuple[str, ...]]] = {
    "bert": ("bert.encoder.layer", "attention.self", ("query", "key", "value"),
             "attention.output.dense", ("intermediate.dense",), "output.dense", ()),
    "roberta": ("roberta.encoder.layer", "attention.self", ("query", "key", "value"),
                "attention.output.dense", ("intermediate.dense",), "output.dense", ()),
    "gpt_neo": ("transformer.h", "attn.attention", ("q_proj", "k_proj", "v_proj"),
                "attn.attention.out_proj", ("mlp.c_fc",), "mlp.c_proj", ("num_heads",)),
    "opt": ("model.decoder.layers", "self_attn", ("q_proj", "k_proj", "v_proj"),
            "self_attn.out_proj", ("fc1",), "fc2", ("num_heads",)),
    "llama": ("model.layers", "self_attn", ("q_proj", "k_proj", "v_proj"), "self_attn.o_proj",
              ("mlp.gate_proj", "mlp.up_proj"), "mlp.down_proj", ()),
}
# family -> (first layer, per-layer norms, attention module and how it takes hidden_states
# ("arg" or "kwarg"), MLP module, final norm)
SP_LAYOUTS: Dict[str, Tuple[str, Tuple[str, ...], str, str, str, str]] = {
    "llama": ("model.layers.0", ("input_layernorm", "post_attention_layernorm"), "self_attn",
              "kwarg", "mlp", "model.norm"),
    "gpt_neo": ("transformer.h.0", ("ln_1", "ln_2"), "attn", "arg", "mlp", "transformer.ln_f"),
}
_UNSUPPORTED = {
    "gpt2": "HF GPT-2 uses transformers' Conv1D layers (weights [in, out]), which DTensor's "
            "ColwiseParallel/RowwiseParallel do not shard (they cover nn.Linear/nn.Embedding)",
    "albert": "ALBERT calls one shared layer module for every layer; no DTensor plan is written "
              "for it",
    "wideresnet": "WideResNet is convolutional; DTensor's parallel styles cover nn.Linear and "
                  "nn.Embedding only",
}


def _unsupported(family: str) -> ConfigError:
    why = _UNSUPPORTED.get(family, f"no DTensor plan for family {family!r}")
    return ConfigError(f"mode 'dtensor-tp' does not support {family}: {why}",
                       call="end2end.driver.baselines.dtensor_plans",
                       hint="compare this family with slapo-megatron vs megatron, or fsdp")


def _layers(model: nn.Module, stack: str) -> List[str]:
    return [f"{stack}.{name}" for name, _ in model.get_submodule(stack).named_children()]


def _t5_layers(model: nn.Module) -> Dict[str, Any]:
    """T5: self-attention (+ cross-attention in the decoder) and the FFN of every block."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: Dict[str, Any] = {}
    gated = hasattr(model.encoder.block[0].layer[-1].DenseReluDense, "wi_0")
    for stack in ("encoder.block", "decoder.block"):
        for block in _layers(model, stack):
            n = len(model.get_submodule(f"{block}.layer"))
            for i, attn in ((0, "SelfAttention"), (1, "EncDecAttention")):
                if i == n - 1:  # the last sub-layer is the FFN
                    break
                a = f"{block}.layer.{i}.{attn}"
                plan.update({f"{a}.{p}": ColwiseParallel() for p in "qkv"})
                plan[f"{a}.o"] = RowwiseParallel()
                if getattr(model.get_submodule(a), "has_relative_attention_bias", False):
                    plan[f"{a}.relative_attention_bias"] = ColwiseParallel()  # [buckets, heads]
            ff = f"{block}.layer.{n - 1}.DenseReluDense"
            wi = ("wi_0", "wi_1") if gated else ("wi",)
            plan.update({f"{ff}.{w}": ColwiseParallel() for w in wi})
            plan[f"{ff}.wo"] = RowwiseParallel()
    return plan


def _word_embedding_owners(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """Every module whose ``weight`` is the input word embedding (the embedding, its tied copies
    and a tied LM head)."""
    weight = model.get_input_embeddings().weight
    return [(name, mod) for name, mod in model.named_modules()
            if getattr(mod, "weight", None) is weight]


def _tied_groups(model: nn.Module) -> List[List[Tuple[str, str]]]:
    """(module path, attribute) of every parameter owned by several modules, one list a
    parameter."""
    groups: Dict[int, List[Tuple[str, str]]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        module, _, attr = name.rpartition(".")
        groups.setdefault(id(p), []).append((module, attr))
    return [g for g in groups.values() if len(g) > 1]


def _sequence_parallel(model: nn.Module, family: str, plan: Dict[str, Any]) -> None:
    """Turn ``plan`` into its sequence-parallel form (see the module docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)

    first, norms, attn, attn_input, mlp, final = SP_LAYOUTS[family]
    stack = FAMILY_LAYOUTS[family][0]
    gather = dict(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    for layer in _layers(model, stack):
        plan.update({f"{layer}.{n}": SequenceParallel() for n in norms})
        plan[f"{layer}.{attn}"] = PrepareModuleInput(**gather) if attn_input == "arg" else \
            PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                               desired_input_kwarg_layouts={"hidden_states": Replicate()})
        plan[f"{layer}.{mlp}"] = PrepareModuleInput(**gather)
        for name, style in list(plan.items()):  # row-parallel exits reduce-scatter
            if name.startswith(layer + ".") and isinstance(style, RowwiseParallel):
                plan[name] = RowwiseParallel(output_layouts=Shard(1))
    plan[first] = PrepareModuleInput(input_layouts=(Replicate(),),
                                      desired_input_layouts=(Shard(1),), use_local_output=True)
    plan[final] = SequenceParallel()
    for name, style in list(plan.items()):
        if isinstance(style, ColwiseParallel) and name == _head_name(model):
            plan[name] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                         use_local_output=False)


def _head_name(model: nn.Module) -> str:
    head = model.get_output_embeddings()
    return next((name for name, mod in model.named_modules() if mod is head), "")


def tp_plan(model: nn.Module, family: str, sequence_parallel: bool = True) -> Dict[str, Any]:
    """The ``parallelize_module`` plan of ``model`` (a HF model of ``family``); with
    ``sequence_parallel`` its sequence-parallel form where the family allows it
    (:data:`SP_LAYOUTS`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if family not in FAMILY_LAYOUTS and family != "t5":
        raise _unsupported(family)
    plan: Dict[str, Any] = {}
    if family == "t5":
        plan.update(_t5_layers(model))
    else:
        stack, attn, qkv, attn_out, mlp_in, mlp_out, _ = FAMILY_LAYOUTS[family]
        for layer in _layers(model, stack):
            plan.update({f"{layer}.{attn}.{p}": ColwiseParallel() for p in qkv})
            plan[f"{layer}.{attn_out}"] = RowwiseParallel()
            plan.update({f"{layer}.{p}": ColwiseParallel() for p in mlp_in})
            plan[f"{layer}.{mlp_out}"] = RowwiseParallel()
    for name, mod in _word_embedding_owners(model):
        if isinstance(mod, nn.Embedding):  # vocab-parallel embedding
            plan[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if _head_name(model):  # logits stay sharded over the vocabulary for loss_parallel
        plan[_head_name(model)] = ColwiseParallel(output_layouts=Shard(-1),
                                                  use_local_output=False)
    if sequence_parallel and family in SP_LAYOUTS:
        _sequence_parallel(model, family, plan)
    return plan


def _localise_heads(model: nn.Module, family: str, tp: int) -> None:
    """Divide the global head counts that HF attention code reshapes with by ``tp``."""
    attrs = FAMILY_LAYOUTS[family][-1] if family in FAMILY_LAYOUTS else ("n_heads",)
    for _, mod in model.named_modules():
        for attr in attrs:
            heads = getattr(mod, attr, None)
            if isinstance(heads, int) and hasattr(mod, "forward") and not isinstance(mod, (
                    nn.Linear, nn.Embedding)):
                if heads % tp:
                    raise ConfigError(f"{type(mod).__name__}.{attr} = {heads} heads cannot be "
                                      f"split over {tp} tensor-parallel ranks",
                                      call="dtensor-tp", hint="use a TP size dividing the heads")
                setattr(mod, attr, heads // tp)


def apply_tp_plan(model: nn.Module, family: str, mesh: Any,
                  sequence_parallel: bool = True) -> nn.Module:
    """Parallelise ``model`` in place over the 1-D ``mesh`` with its family's plan (sequence
    parallel where the family allows, unless ``sequence_parallel=False``); weights tied to the
    word embedding stay one parameter (re-pointed after the styles distributed them)."""
    from torch.distributed.tensor.parallel import parallelize_module

    plan = tp_plan(model, family, sequence_parallel)
    tied = _tied_groups(model)
    parallelize_module(model, mesh, plan)
    for owners in tied:  # re-tie: every owner gets the distributed copy (a DTensor if any)
        params = [getattr(model.get_submodule(m), a) for m, a in owners]
        keep = next((p for p in params if hasattr(p, "placements")), params[0])
        for m, a in owners:
            setattr(model.get_submodule(m), a, keep)
    _localise_heads(model, family, mesh.size())
    return model


def parallel_loss():
    """The context the forward+backward of a ``dtensor-tp`` model runs in: cross-entropy over
    vocab-sharded logits without gathering them (``loss_parallel``)."""
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel() if loss_parallel is not None else contextlib.nullcontext()
