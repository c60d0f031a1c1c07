"""The ``hf-tp`` baseline: the unmodified HuggingFace model sharded by transformers' own tensor
parallelism, from the plan its config declares (``base_model_tp_plan`` plus the model class's
``_tp_plan``: ``colwise``, ``rowwise``, ``packed_colwise``, ``moe_tp_experts``,
``colwise_gather_output`` for the LM head, ``embedding_rowwise`` for the word embedding ...).
It is the peer a user of HF's own TP would pick.

How HF applies it: ``from_pretrained(path, tp_plan="auto")`` (``DistributedConfig(tp_size=n,
tp_plan="auto")``) creates the device mesh (``prepare_distribute_model``), resolves the plan
with the layer numbers filled in (``_resolve_parallel_plans``), and calls
``transformers.distributed.tensor_parallel.apply_tensor_parallelism(model, mesh, plan)`` after
building the model and before loading the checkpoint (``maybe_distribute_model``). Here the
model is built from a config with the same seeded weights on every rank (no download), and the
same three steps run on it: each style's ``shard_param`` keeps this rank's slice of the full
weight (``distribute_tensor(..., src_data_rank=None)``), so the sharded model equals the
unsharded one. ``from_pretrained`` itself would need a saved checkpoint and ``accelerate``
(transformers 5.24 refuses ``tp_plan`` without it).

One compatibility fix, for models whose LM head is tied to the word embedding (Gemma 3): in
transformers 5.24 the resolved plan names the head's parameter (``lm_head.weight``), which
``named_parameters()`` lists only under the embedding, and ``apply_tensor_parallelism`` fails
with ``KeyError: 'lm_head.weight'`` (``from_pretrained`` would too). The head's parameter entry
is dropped: the embedding's ``embedding_rowwise`` entry shards the shared weight on dim 0, which
is the placement ``colwise_gather_output`` gives a head, and the head keeps its forward hook;
then ``tie_weights()`` points the head at the sharded weight again (as ``from_pretrained`` does
after loading). Delete it when transformers handles tied weights in that function.

The loss is HF's own: the head gathers the logits (``colwise_gather_output``), and every rank
computes the same cross-entropy over the full vocabulary.
"""

from __future__ import annotations

from typing import Any, Dict

from torch import nn

from slapo.errors import ConfigError

__all__ = ["hf_tp_plan", "apply_hf_tensor_parallel"]

_CALL = "end2end.driver.baselines.hf_tp"


def _distributed_config(world_size: int) -> Any:
    from transformers.distributed import DistributedConfig

    return DistributedConfig(tp_size=world_size, tp_plan="auto")


def hf_tp_plan(model: nn.Module, world_size: int) -> Dict[str, str]:
    """HF's resolved plan of ``model`` for ``world_size`` ranks (module or parameter path ->
    style name), without the entries of parameters that ``named_parameters()`` lists under
    another name (a tied LM head, see the module docstring).

    Raises:
        ConfigError: the model's config declares no tensor-parallel plan.
    """
    if not getattr(model, "tp_plan", None):
        config = getattr(model, "config", None)
        raise ConfigError(
            f"mode 'hf-tp' needs a model whose HF config declares a tensor-parallel plan; "
            f"{type(config).__name__ if config is not None else type(model).__name__} has no "
            "base_model_tp_plan", call=_CALL,
            hint="use mode 'dtensor-tp' (hand-written DTensor plans) or a Slapo mode for it")
    plan, _, _ = model._resolve_parallel_plans(_distributed_config(world_size))
    modules = dict(model.named_modules())
    parameters = dict(model.named_parameters())
    return {name: style for name, style in plan.items()
            if name in modules or name in parameters}


def apply_hf_tensor_parallel(model: nn.Module, world_size: int) -> nn.Module:
    """Shard ``model`` (a HF ``PreTrainedModel``, the same weights on every rank) in place over
    all ``world_size`` ranks with transformers' ``apply_tensor_parallelism`` and its own plan;
    the parameters become ``DTensor`` shards."""
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    plan = hf_tp_plan(model, world_size)
    config, _, meshes = type(model).prepare_distribute_model(_distributed_config(world_size))
    if meshes is None:  # one rank: nothing to shard
        return model
    apply_tensor_parallelism(model, meshes.get_mesh("tp"), plan)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()  # the head shares the embedding's sharded weight again
    return model
