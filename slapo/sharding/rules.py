"""Per-module-type shard rules: what sharding a tensor of a module means for the module.

A :class:`ShardRule` is registered for a module class (``register_shard_rule``; dispatch follows
the class's MRO, so the most specific registered class wins; :class:`ShardRule` itself is the
default for any other module). ``shard`` asks the rule of every module owning the tensor to

1. map the requested axis to the tensor's axis (:meth:`ShardRule.tensor_axis`; e.g. for HF
   ``Conv1D``, ``shard(["weight", "bias"], axis=1)`` shards the 1-D bias along its axis 0),
2. check the combination with earlier shards of the module (:meth:`ShardRule.check`),
3. fix the module's attributes from the new tensor shapes and infer the module's activation
   layout (:meth:`ShardRule.update`),

and :func:`~slapo.sharding.layout_check.check_layouts` asks it for incomplete shards
(:meth:`ShardRule.problems`). Rules raise :class:`RuleViolation`, which ``shard`` turns into a
:class:`~slapo.errors.ShardError` naming the call and the module.

:class:`HeadRule` s (registered per attention class) describe attention modules whose head
projections are sharded column-wise: the head count must divide, fused projections (GPT-2's
``c_attn``) must be sharded with ``fused=`` so each rank gets whole q/k/v heads, and attributes the
attention's forward uses (e.g. GPT-2's ``split_size``) are divided by the TP size once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, Union

import torch
from torch import nn

from .layout import PARTIAL, REPLICATED, ModuleLayout, ShardInfo, partition

__all__ = [
    "RuleViolation", "ShardRule", "register_shard_rule", "rule_for", "HeadRule",
    "register_head_rule", "head_rule_for", "is_hf_conv1d",
]


class RuleViolation(Exception):
    """Raised by rules; ``shard`` re-raises it as a ShardError with the call's context."""

    def __init__(self, what: str, hint: str):
        super().__init__(what)
        self.what, self.hint = what, hint


@dataclasses.dataclass(frozen=True)
class ShardContext:
    """The TP group's ``world_size`` and this process's ``rank`` in it."""

    world_size: int
    rank: int


class ShardRule:
    """Default rule: any parameter/buffer, any axis; no attributes to fix; layout unknown."""

    def tensor_axis(self, mod: nn.Module, name: str, tensor: torch.Tensor, axis: int) -> int:
        """The axis of ``tensor`` that the requested ``axis`` means for this module type."""
        return axis

    def check(self, mod: nn.Module, tensors: Dict[str, int]) -> None:
        """Validate the module's sharded tensors (earlier ones plus this call's)."""

    def update(self, mod: nn.Module, info: ShardInfo, ctx: ShardContext) -> None:
        """Fix ``mod``'s attributes after sharding and set ``info.layout``."""

    def problems(self, mod: nn.Module, info: ShardInfo) -> List[Tuple[str, str]]:
        """``(what, hint)`` pairs for shards left incomplete (e.g. a whole bias)."""
        return []


ClassKey = Union[Type[nn.Module], str]
_RULES: Dict[ClassKey, ShardRule] = {}


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _lookup(table: Dict[ClassKey, Any], mod: Optional[nn.Module]) -> Any:
    """The entry of the most specific class of ``mod`` (MRO order) registered in ``table``,
    by class or by ``"module.QualName"`` string (so optional libraries such as transformers are
    not imported just to register their classes)."""
    for cls in type(mod).__mro__ if mod is not None else ():
        if cls in table:
            return table[cls]
        if _qualname(cls) in table:
            return table[_qualname(cls)]
    return None


def register_shard_rule(cls: ClassKey) -> Callable[[ShardRule], ShardRule]:
    """Register a rule instance for module class ``cls`` (a class or its ``"module.QualName"``):
    ``register_shard_rule(Foo)(FooRule())``."""

    def add(rule: ShardRule) -> ShardRule:
        _RULES[cls] = rule
        return rule

    return add


def rule_for(mod: nn.Module) -> ShardRule:
    """The rule of the most specific registered class in ``type(mod).__mro__``."""
    return _lookup(_RULES, mod) or _DEFAULT


_DEFAULT = ShardRule()


def _column_row(out_axis: int, act_axis: int, column: bool) -> ModuleLayout:
    if column:  # replicated input -> output split on its feature axis; input grad partial
        return ModuleLayout(REPLICATED, partition(act_axis), input_grad_partial=True)
    return ModuleLayout(partition(act_axis), PARTIAL)


class LinearRule(ShardRule):
    """``nn.Linear`` (weight ``[out, in]``): axis 0 = column (shard bias too), axis 1 = row."""

    weight_out_axis = 0

    def tensor_axis(self, mod, name, tensor, axis):
        if name == "bias":
            if axis == 1 - self.weight_out_axis:
                raise RuleViolation(
                    "the bias of a row-sharded layer is not sharded",
                    "shard only 'weight' for row parallelism; the bias stays whole and is added "
                    "once, after sync('fwd_post', 'all_reduce')")
            return 0
        return axis

    def check(self, mod, tensors):
        w = tensors.get("weight")
        if w is not None and w not in (0, 1):
            raise RuleViolation(f"a {type(mod).__name__} weight has axes 0 and 1, not {w}",
                                "use axis=0 (output features) or axis=1 (input features)")
        if w == 1 - self.weight_out_axis and "bias" in tensors:
            raise RuleViolation(
                "the bias cannot be sharded when the weight is sharded on its input axis",
                "shard only 'weight' for row parallelism; the bias is added once after the "
                "reduction")

    def update(self, mod, info, ctx):
        w = getattr(mod, "weight", None)
        if w is not None:
            out_size = w.shape[self.weight_out_axis]
            in_size = w.shape[1 - self.weight_out_axis]
            self.set_sizes(mod, in_size, out_size)
        column = info.tensors.get("weight", self.weight_out_axis) == self.weight_out_axis
        info.layout = _column_row(0, -1, column)

    def set_sizes(self, mod, in_size: int, out_size: int) -> None:
        mod.in_features, mod.out_features = in_size, out_size

    def problems(self, mod, info):
        out = []
        bias = getattr(mod, "bias", None)
        if info.tensors.get("weight") == self.weight_out_axis and bias is not None \
                and "bias" not in info.tensors:
            out.append(("the weight is sharded on its output axis but the bias is whole",
                        f"shard(['weight', 'bias'], axis={self.weight_out_axis})"))
        if "bias" in info.tensors and "weight" not in info.tensors:
            out.append(("the bias is sharded but the weight is not",
                        f"shard(['weight', 'bias'], axis={self.weight_out_axis})"))
        return out


class Conv1DRule(LinearRule):
    """HF ``Conv1D`` (weight ``[in, out]``): axis 1 = column (the bias goes along), axis 0 = row.
    ``shard(["weight", "bias"], axis=1)`` shards the 1-D bias on its only axis."""

    weight_out_axis = 1

    def tensor_axis(self, mod, name, tensor, axis):
        if name == "bias":
            return 0  # a row request is rejected by check() (bias with weight axis 0)
        return axis

    def set_sizes(self, mod, in_size, out_size):
        mod.nx, mod.nf = in_size, out_size


class EmbeddingRule(ShardRule):
    """``nn.Embedding``: axis 0 = vocab-parallel (masked lookup, partial output that needs an
    all-reduce), axis 1 = embedding dim (output partitioned on its last axis)."""

    def check(self, mod, tensors):
        if tensors.get("weight") not in (None, 0, 1):
            raise RuleViolation("an Embedding weight has axes 0 (vocab) and 1 (embedding dim)",
                                "use axis=0 (vocab-parallel) or axis=1")

    def update(self, mod, info, ctx):
        from .vocab_parallel import make_vocab_parallel

        mod.num_embeddings, mod.embedding_dim = mod.weight.shape
        if info.tensors.get("weight") == 0:
            make_vocab_parallel(mod, ctx.rank * mod.num_embeddings, mod.num_embeddings)
            info.layout = ModuleLayout(REPLICATED, PARTIAL)
        else:
            info.layout = ModuleLayout(REPLICATED, partition(-1))


class Conv2dRule(ShardRule):
    """``nn.Conv2d`` (weight ``[out, in, kh, kw]``, ``groups == 1``): axis 0 = output channels
    (with the bias), axis 1 = input channels (partial output). Activations are ``N, C, H, W``:
    the channel axis is -3."""

    def check(self, mod, tensors):
        if mod.groups != 1:
            raise RuleViolation(f"grouped convolutions (groups={mod.groups}) are not supported",
                                "shard only Conv2d layers with groups=1")
        w = tensors.get("weight")
        if w is not None and w not in (0, 1):
            raise RuleViolation(f"a Conv2d weight can be sharded on axis 0 or 1, not {w}",
                                "use axis=0 (output channels) or axis=1 (input channels)")
        if w == 1 and "bias" in tensors:
            raise RuleViolation("the bias cannot be sharded when the weight is sharded on its "
                                "input channels", "shard only 'weight' with axis=1")

    def update(self, mod, info, ctx):
        mod.out_channels, mod.in_channels = mod.weight.shape[:2]
        column = info.tensors.get("weight", 0) == 0
        info.layout = _column_row(0, -3, column)

    def problems(self, mod, info):
        return LinearRule.problems(self, mod, info) if info.tensors.get("weight") == 0 else []

    weight_out_axis = 0


class BatchNorm2dRule(ShardRule):
    """``nn.BatchNorm2d``: only axis 0 (channels); weight, bias and running statistics must all
    be sharded, so its input and output are partitioned on the channel axis (-3)."""

    channel_tensors = ("weight", "bias", "running_mean", "running_var")

    def check(self, mod, tensors):
        bad = {n: a for n, a in tensors.items() if a != 0}
        if bad:
            raise RuleViolation(f"BatchNorm2d tensors can only be sharded on axis 0, got {bad}",
                                "use axis=0 (channels)")

    def update(self, mod, info, ctx):
        for name in self.channel_tensors:
            t = getattr(mod, name, None)
            if t is not None and name in info.tensors:
                mod.num_features = t.shape[0]
        info.layout = ModuleLayout(partition(-3), partition(-3))

    def problems(self, mod, info):
        missing = [n for n in self.channel_tensors
                   if getattr(mod, n, None) is not None and n not in info.tensors]
        if not missing:
            return []
        present = [n for n in self.channel_tensors if getattr(mod, n, None) is not None]
        return [(f"per-channel tensors {missing} are not sharded",
                 f"shard({present}, axis=0) in one call")]


register_shard_rule(nn.Linear)(LinearRule())
register_shard_rule(nn.Embedding)(EmbeddingRule())
register_shard_rule(nn.Conv2d)(Conv2dRule())
register_shard_rule(nn.BatchNorm2d)(BatchNorm2dRule())
HF_CONV1D = "transformers.pytorch_utils.Conv1D"
register_shard_rule(HF_CONV1D)(Conv1DRule())


def is_hf_conv1d(mod: nn.Module) -> bool:
    """Whether ``mod`` is (a subclass of) HF ``transformers.pytorch_utils.Conv1D``."""
    return any(_qualname(c) == HF_CONV1D for c in type(mod).__mro__)


# ---------------------------------------------------------------- attention head rules
@dataclasses.dataclass(frozen=True)
class HeadRule:
    """An attention class whose head projections may be sharded column-wise.

    ``projections(attn)`` maps child names to how many projections are fused in them (GPT-2's
    ``c_attn`` fuses q, k, v: 3); ``head_dim`` names the attribute with the head size; ``divide``
    lists attributes the forward reads that must become per-rank values (divided by the TP size
    once, when the first projection is sharded).
    """

    projections: Callable[[nn.Module], Dict[str, int]]
    head_dim: str
    divide: Tuple[str, ...] = ()


_HEAD_RULES: Dict[ClassKey, HeadRule] = {}


def register_head_rule(cls: ClassKey, rule: HeadRule) -> None:
    """Register the head rule of attention class ``cls`` (a class or ``"module.QualName"``)."""
    _HEAD_RULES[cls] = rule


def head_rule_for(mod: Optional[nn.Module]) -> Optional[HeadRule]:
    """The head rule of ``mod``'s class (MRO order), if any."""
    return _lookup(_HEAD_RULES, mod)


def _register_hf_head_rules() -> None:
    hf = "transformers.models"
    register_head_rule(f"{hf}.bert.modeling_bert.BertSelfAttention", HeadRule(
        lambda m: {"query": 1, "key": 1, "value": 1}, "attention_head_size",
        ("num_attention_heads", "all_head_size")))
    register_head_rule(f"{hf}.gpt2.modeling_gpt2.GPT2Attention", HeadRule(
        lambda m: ({"c_attn": 2, "q_attn": 1} if m.is_cross_attention else {"c_attn": 3}),
        "head_dim", ("num_heads", "embed_dim", "split_size")))
    register_head_rule(f"{hf}.llama.modeling_llama.LlamaAttention", HeadRule(
        lambda m: {"q_proj": 1, "k_proj": 1, "v_proj": 1}, "head_dim", ()))


_register_hf_head_rules()
