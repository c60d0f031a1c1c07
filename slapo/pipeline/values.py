"""Values crossing a pipeline cut, as the tensors that travel between stages.

Runtimes (``torch.distributed.pipelining``, DeepSpeed) send only tensors between stages, but a
traced model passes other values from one layer to the next: ``None`` masks, sequence lengths,
shapes, and *nested* values such as LLaMA's rotary ``position_embeddings = (cos, sin)`` or a
decoder layer's output tuple. :func:`crossing` decides, once per value and from its example
value (``node.meta["val"]``), how it travels:

* a tensor travels as it is; ``None`` is re-created on the receiving stage (nothing is sent);
* an ``int`` / ``bool`` / ``float`` / ``torch.Size`` / tuple of ints is packed into an ``int64``
  (or float) tensor (:func:`pack_value`) and unpacked on the other side, so values computed from
  shapes stay correct for other batch and sequence sizes;
* a tuple / list / dict / ``ModelOutput`` (nested, anything ``torch.utils._pytree`` flattens) is
  flattened: its tensor leaves and packed numeric leaves travel as separate tensors, ``None`` and
  strings are constants of the structure, and the receiving stage rebuilds the value with
  :class:`RebuildTree`. The sending stage flattens with :class:`FlattenTree`, which checks that
  the run-time value has the traced structure (``PipelineError`` otherwise: the stages were built
  for that structure).

Anything else (an arbitrary Python object) cannot cross a cut: :func:`crossing` returns None and
the caller reports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
import torch.utils._pytree as pytree

from ..errors import PipelineError

__all__ = ["pack_value", "unpack_value", "Crossing", "crossing", "FlattenTree", "RebuildTree"]

_NUMBERS = (bool, int, float)


def pack_value(value: Any) -> torch.Tensor:
    """An int / bool / float / shape crossing a cut, as a tensor."""
    if isinstance(value, (tuple, list)):
        return torch.tensor([int(v) for v in value], dtype=torch.long)
    return torch.tensor([value])


def unpack_value(t: torch.Tensor, kind: str) -> Any:
    """Inverse of :func:`pack_value`."""
    items = t.tolist()
    if kind == "size":
        return torch.Size(items)
    if kind == "tuple":
        return tuple(items)
    return {"int": int, "bool": bool, "float": float}[kind](items[0])


def _leaf_kind(value: Any) -> Optional[str]:
    """How a single (non-container) value travels: tensor / none / a packed kind / None."""
    if isinstance(value, torch.Tensor):
        return "tensor"
    if value is None:
        return "none"
    if isinstance(value, torch.Size):
        return "size"
    if isinstance(value, tuple) and value and all(type(v) is int for v in value):
        return "tuple"
    for t in _NUMBERS:  # bool before int: bool is an int
        if isinstance(value, t):
            return t.__name__
    return None


@dataclass(frozen=True)
class Crossing:
    """How one value crosses a cut.

    Attributes:
        kind: ``"tensor"``, ``"none"``, a packed kind (``"int"``, ``"size"``, ...) or
            ``"tree"``.
        spec: the pytree structure (``"tree"`` only).
        leaves: per leaf of the tree: ``"tensor"``, a packed kind, or ``"const"``.
        consts: per leaf: the traced constant (``"const"`` leaves), else None.
    """

    kind: str
    spec: Any = None
    leaves: Tuple[str, ...] = ()
    consts: Tuple[Any, ...] = ()

    @property
    def num_tensors(self) -> int:
        """How many tensors carry the value between stages."""
        if self.kind == "tree":
            return sum(k != "const" for k in self.leaves)
        return 0 if self.kind == "none" else 1


def crossing(value: Any) -> Optional[Crossing]:
    """How ``value`` (an example value) crosses a cut, or None when it cannot."""
    kind = _leaf_kind(value)
    if kind is not None:
        return Crossing(kind)
    if not isinstance(value, (tuple, list, dict)):
        return None
    flat, spec = pytree.tree_flatten(value)
    leaves, consts = [], []
    for leaf in flat:
        k = _leaf_kind(leaf)
        if k in ("none", None):
            if leaf is not None and not isinstance(leaf, str):
                return None
            leaves.append("const")
            consts.append(leaf)
        else:
            leaves.append(k)
            consts.append(None)
    return Crossing("tree", spec, tuple(leaves), tuple(consts))


class FlattenTree:
    """Graph function on the sending stage: ``value -> tuple of tensors`` (see module docs)."""

    __name__ = "flatten_crossing"

    def __init__(self, name: str, how: Crossing):
        self.name, self.how = name, how

    def __call__(self, value: Any) -> Tuple[torch.Tensor, ...]:
        how = self.how
        flat, spec = pytree.tree_flatten(value)
        if spec != how.spec:
            now = pytree.tree_unflatten(["*"] * len(flat), spec)
            then = pytree.tree_unflatten(["*"] * len(how.leaves), how.spec)
            raise PipelineError(
                f"value '{self.name}' crossing a cut is {now} now but was {then} when the "
                "stages were built", call="pipeline stage",
                hint="build the stages with example inputs like the ones you run")
        out: List[torch.Tensor] = []
        for leaf, kind, const in zip(flat, how.leaves, how.consts):
            if kind == "const":
                if leaf is not const and leaf != const:
                    raise PipelineError(
                        f"value '{self.name}' crossing a cut holds {leaf!r} now but held "
                        f"{const!r} when the stages were built", call="pipeline stage",
                        hint="build the stages with example inputs like the ones you run")
            elif kind == "tensor":
                if not isinstance(leaf, torch.Tensor):
                    raise PipelineError(
                        f"value '{self.name}' crossing a cut holds a {type(leaf).__name__} "
                        "where it held a tensor when the stages were built",
                        call="pipeline stage",
                        hint="build the stages with example inputs like the ones you run")
                out.append(leaf)
            else:
                out.append(pack_value(leaf))
        return tuple(out)

    def __repr__(self) -> str:
        return f"FlattenTree({self.name!r})"


class RebuildTree:
    """Graph function on the receiving stage: ``*tensors -> value`` (inverse of
    :class:`FlattenTree`)."""

    __name__ = "rebuild_crossing"

    def __init__(self, name: str, how: Crossing):
        self.name, self.how = name, how

    def __call__(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        flat = []
        for kind, const in zip(self.how.leaves, self.how.consts):
            if kind == "const":
                flat.append(const)
            elif kind == "tensor":
                flat.append(next(it))
            else:
                flat.append(unpack_value(next(it), kind))
        return pytree.tree_unflatten(flat, self.how.spec)

    def __repr__(self) -> str:
        return f"RebuildTree({self.name!r})"
