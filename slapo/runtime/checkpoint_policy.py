"""Selective (op-level) activation checkpointing: which ATen ops' outputs a checkpointed module
keeps for backward.

``sch[path].checkpoint()`` keeps only the module's inputs and recomputes its whole forward in
backward. With a :class:`SavePolicy` (``checkpoint(policy=...)``) the outputs of the expensive
ops are kept and only the cheap ones (norms, activations, softmax, dropout, element-wise ops)
are recomputed: less memory than no checkpointing, less recomputation than checkpointing the
whole module. This is what torchtitan calls selective "op" activation checkpointing; it runs on
PyTorch's selective checkpointing (``torch.utils.checkpoint`` with ``context_fn`` from
``create_selective_checkpoint_contexts``).

What a policy keeps:

* ``matmuls``: the outputs of ``aten.mm`` and ``aten.addmm``, the GEMMs of linear layers (HF's
  Conv1D too). Batched matmuls (``bmm``, ``baddbmm``) are recomputed: in an unfused attention
  they make the [L, L] scores, the largest tensors of a layer.
* ``attention``: the outputs of the fused attention kernels that
  ``scaled_dot_product_attention`` dispatches to (flash, memory-efficient, cuDNN, CPU flash).
* ``matmul_every=n`` keeps only the 1st, (n+1)-th, (2n+1)-th ... matmul of each call of the
  module, in forward order; the others are recomputed (torchtitan's policy keeps every second
  one: ``matmul_every=2``).

Presets by name (:data:`POLICIES`): ``"save_matmuls"`` (every matmul and attention output) and
``"save_every_other_matmul"`` (torchtitan's: every second matmul and every attention output).

RNG-exact: an op that draws random numbers is never kept, whatever the policy (an attention
kernel with ``dropout_p > 0`` is recomputed). The recomputation replays the module's forward from
the RNG state the forward started with; a kept random op would be skipped there, and every later
random op (dropout) would draw other numbers than it did in the forward.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Dict, FrozenSet, Iterable, Optional, Union

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ..errors import CheckpointError

__all__ = ["SavePolicy", "POLICIES", "resolve_policy", "MATMUL_OPS", "ATTENTION_OPS"]


def _default_overloads(names: Iterable[str]) -> FrozenSet[Any]:
    """``torch.ops.aten.<name>.default`` of each name this PyTorch has."""
    found = (getattr(getattr(torch.ops.aten, n, None), "default", None) for n in names)
    return frozenset(op for op in found if op is not None)


MATMUL_OPS = _default_overloads(("mm", "addmm"))
ATTENTION_OPS = _default_overloads((
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable"))


@dataclasses.dataclass(frozen=True)
class SavePolicy:
    """Which op outputs selective checkpointing keeps (module docstring); the rest is recomputed.

    Attributes:
        matmuls: keep the outputs of the linear layers' matmuls (``aten.mm``/``aten.addmm``).
        attention: keep the outputs of the fused attention kernels.
        matmul_every: keep only every ``n``-th matmul of a call, starting with the first.

    Raises:
        CheckpointError: a field of the wrong type, ``matmul_every`` < 1, or nothing kept.
    """

    matmuls: bool = True
    attention: bool = True
    matmul_every: int = 1

    def __post_init__(self) -> None:
        for name in ("matmuls", "attention"):
            if not isinstance(getattr(self, name), bool):
                raise CheckpointError(f"{name} must be True or False, got "
                                      f"{getattr(self, name)!r}", call=self._call(),
                                      hint=f"e.g. {name}=False")
        every = self.matmul_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise CheckpointError(f"matmul_every must be an integer >= 1, got {every!r}",
                                  call=self._call(), hint="1 keeps every matmul, 2 every "
                                  "second one (torchtitan's policy)")
        if not (self.matmuls or self.attention):
            raise CheckpointError("the policy keeps no op's output", call=self._call(),
                                  hint="call checkpoint() without a policy to recompute the "
                                       "whole module")

    def _call(self) -> str:
        return (f"SavePolicy(matmuls={self.matmuls!r}, attention={self.attention!r}, "
                f"matmul_every={self.matmul_every!r})")

    def context_fn(self):
        """The (forward, recompute) contexts of one checkpointed call (``context_fn`` of
        ``torch.utils.checkpoint``): a fresh chooser per call, so the matmul count restarts."""
        return create_selective_checkpoint_contexts(_SaveChooser(self))


POLICIES: Dict[str, SavePolicy] = {
    "save_matmuls": SavePolicy(),
    "save_every_other_matmul": SavePolicy(matmul_every=2),
}


def _draws_random_numbers(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether this call of ``func`` consumes random numbers: its ``dropout_p`` argument is not
    zero, or (no such argument) it is tagged as a seeded random op."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "dropout_p":
            if arg.name in kwargs:
                return bool(kwargs[arg.name])
            return bool(args[i]) if i < len(args) else bool(arg.default_value)
    return torch.Tag.nondeterministic_seeded in func.tags


class _SaveChooser:
    """The policy function of one checkpointed call: MUST_SAVE for the ops ``policy`` keeps,
    PREFER_RECOMPUTE for the rest. Matmuls are counted per pass (forward; the recomputation, on
    PyTorch versions that ask the policy again there)."""

    def __init__(self, policy: SavePolicy):
        self.policy = policy
        self.matmuls_seen = {False: 0, True: 0}

    def __call__(self, ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        keep = False
        if func in MATMUL_OPS:
            recompute = bool(getattr(ctx, "is_recompute", False))
            index = self.matmuls_seen[recompute]
            self.matmuls_seen[recompute] = index + 1
            keep = self.policy.matmuls and index % self.policy.matmul_every == 0
        elif func in ATTENTION_OPS:
            keep = self.policy.attention
        if keep and not _draws_random_numbers(func, args, kwargs):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE


def resolve_policy(policy: Union[str, SavePolicy], *, call: Optional[str] = None,
                   path: Optional[str] = None, module: Any = None) -> SavePolicy:
    """``policy`` as a :class:`SavePolicy`: a preset's name (:data:`POLICIES`) or the object.

    Raises:
        CheckpointError: an unknown name (with the closest one) or another type.
    """
    if isinstance(policy, SavePolicy):
        return policy
    names = ", ".join(repr(n) for n in POLICIES)
    if isinstance(policy, str):
        if policy in POLICIES:
            return POLICIES[policy]
        close = difflib.get_close_matches(policy, list(POLICIES), n=1)
        raise CheckpointError(f"unknown checkpoint policy {policy!r}", call=call, path=path,
                              module=module, hint=(f"did you mean {close[0]!r}? " if close
                                                   else "") + f"use {names} or a "
                              "slapo.SavePolicy(...)")
    raise CheckpointError(f"policy must be a preset's name or a slapo.SavePolicy, got "
                          f"{type(policy).__name__}", call=call, path=path, module=module,
                          hint=f"use {names} or e.g. slapo.SavePolicy(matmul_every=2)")
