"""How much of each layer list the plan shards: refused when it would stay mostly whole.

:func:`.plan.check_plan_paths` refuses an entry whose fixed prefix names no module (a renamed
layer list). An entry under an existing layer list whose rest matches nothing passes it
(``model.layers.*.attn.q_proj`` where the layers hold ``self_attn``): transformers drops such
an entry silently, because a layer kind that this configuration does not use (Qwen3-Next's full
attention in a config of linear-attention layers only, Gemma 4's experts in a dense one, the
dense MLP entries of an all-MoE Qwen3-MoE) looks exactly the same. What tells a renamed module
from an unused layer kind is what is left: :func:`check_coverage` refuses a plan that would leave
most of a layer list's parameters whole while one of its sharding entries under that list is
*misaddressed*: it matches nothing, the module it names a child of is in no layer, and a module
of the entry's last name is there, left whole (the entry ``layers.*.attn.q_proj``, no ``attn``
in any layer, and the whole ``layers.*.self_attn.q_proj``). Not refused: a plan that shards most
of the list (the unmatched entries are a layer kind this config does not use); unmatched entries
below a module that is there (MuseSpark's dense ``mlp.gate_proj`` entries in a config whose
``mlp`` is a MoE block: a different kind of the same layer); and unmatched entries whose name
is nowhere left whole (Flint's dense config: the plan's expert entries match nothing, its
attention has no entry at all, half the layers stay whole as the plan says; a hybrid model whose
Mamba layers have no entry).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence, Tuple

from torch import nn

from ...errors import ConfigError
from .. import common as C
from .plan import PlanEntry, _glob_regex
from .styles import STYLES, AllReduceOutput

__all__ = ["LayerCoverage", "layer_coverage", "check_coverage", "MOSTLY_WHOLE"]

MOSTLY_WHOLE = 0.5
"""A layer list with less than this fraction of its parameters sharded is 'mostly whole'."""


@dataclasses.dataclass(frozen=True)
class LayerCoverage:
    """One layer list the plan's ``*`` globs run over: its ``path``, the parameters (numel,
    tied ones once) it holds (``total``) and that the plan's entries shard (``sharded``), the
    sharding globs that match nothing there (``unmatched``: ``glob: style``), those of them
    that are misaddressed (module docs; ``misaddressed``: ``glob: style`` -> the whole modules
    of its last name, as globs over the layer index) and the layers' children left
    whole with their numel, largest first (``whole``)."""

    path: str
    total: int
    sharded: int
    unmatched: Tuple[str, ...]
    misaddressed: Tuple[Tuple[str, Tuple[str, ...]], ...]
    whole: Tuple[Tuple[str, int], ...]

    @property
    def fraction(self) -> float:
        """The fraction of the list's parameters the plan shards."""
        return self.sharded / self.total if self.total else 1.0


def _shards(style: str) -> bool:
    """Whether plan ``style`` shards the parameters it names (not a replicated style, not a
    bare output all-reduce)."""
    obj = STYLES.get(style)
    return obj is not None and not obj.keeps_whole and not isinstance(obj, AllReduceOutput)


def _sharded_ids(model: nn.Module, entries: Sequence[PlanEntry]) -> Dict[int, int]:
    """id -> numel of every parameter a sharding entry names (a module entry: all of its)."""
    mods = dict(model.named_modules())
    found: Dict[int, int] = {}
    for e in entries:
        if not _shards(e.style) or e.path not in mods:
            continue
        mod = mods[e.path]
        params = [getattr(mod, e.param)] if e.param else list(mod.parameters())
        found.update({id(p): p.numel() for p in params if isinstance(p, nn.Parameter)})
    return found


def _layer_lists(model: nn.Module, plan: Dict[str, str]) -> Dict[str, List[str]]:
    """Layer-list path -> the sharding globs of ``plan`` that run over it (``<list>.*.rest``)."""
    mods = dict(model.named_modules())
    lists: Dict[str, List[str]] = {}
    for glob, style in plan.items():
        head, sep, _ = glob.partition(".*.")
        if sep and _shards(style) and isinstance(mods.get(head), (nn.ModuleList, nn.Sequential)):
            lists.setdefault(head, []).append(glob)
    return lists


def _globbed(name: str) -> str:
    """``"3.self_attn.q_proj"`` (a name inside a layer list) -> ``"*.self_attn.q_proj"``."""
    return ".".join(["*", *name.split(".")[1:]])


def _whole_modules(layers: nn.Module, sharded: Dict[int, int]) -> List[str]:
    """Names inside ``layers`` (the index as ``*``) of the modules holding parameters of their
    own, none sharded."""
    names = [_globbed(name) for name, mod in layers.named_modules()
             if name and list(mod.parameters(recurse=False))
             and not any(id(p) in sharded for p in mod.parameters(recurse=False))]
    return list(dict.fromkeys(names))


def _misaddressed(path: str, layers: nn.Module, glob: str, whole: Sequence[str]) -> List[str]:
    """The whole modules (full globs) of ``glob``'s last name, when the module ``glob`` names a
    child of is in no layer of ``layers`` (module docs); else nothing."""
    parent, _, leaf = glob[len(path) + 1:].rpartition(".")
    existing = {_globbed(n) for n, _ in layers.named_modules() if n}
    if parent in existing:
        return []
    return [C.join(path, n) for n in whole if n.rpartition(".")[2] == leaf]


def _coverage(model: nn.Module, path: str, unmatched: Sequence[Tuple[str, str]],
              sharded: Dict[int, int]) -> LayerCoverage:
    layers = model.get_submodule(path)
    seen: Dict[int, int] = {}
    whole: Dict[str, int] = {}
    for name, p in layers.named_parameters():
        seen[id(p)] = p.numel()
        if id(p) not in sharded:
            parts = name.split(".")  # "<index>.<child>...": grouped by the layer's child
            key = C.join(path, "*", parts[1]) if len(parts) > 2 else C.join(path, name)
            whole[key] = whole.get(key, 0) + p.numel()
    left = _whole_modules(layers, sharded)
    misaddressed = []
    for glob, style in unmatched:
        there = tuple(_misaddressed(path, layers, glob, left))
        if there:
            misaddressed.append((f"{glob}: {style}", there))
    return LayerCoverage(path, sum(seen.values()), sum(n for i, n in seen.items() if i in sharded),
                         tuple(f"{g}: {s}" for g, s in unmatched), tuple(misaddressed),
                         tuple(sorted(whole.items(), key=lambda kv: -kv[1])))


def layer_coverage(model: nn.Module, plan: Dict[str, str],
                   entries: Sequence[PlanEntry]) -> List[LayerCoverage]:
    """For each layer list the plan's sharding globs run over, what the resolved ``entries``
    shard there (:class:`LayerCoverage`). Changes nothing."""
    sharded = _sharded_ids(model, entries)
    names = [n for n, _ in model.named_modules()] + [
        n for n, _ in model.named_parameters(remove_duplicate=False)]
    result = []
    for path, globs in _layer_lists(model, plan).items():
        unmatched = [(g, plan[g]) for g in globs
                     if not any(_glob_regex(g).match(n) for n in names)]
        result.append(_coverage(model, path, unmatched, sharded))
    return result


def check_coverage(model: nn.Module, plan: Dict[str, str], entries: Sequence[PlanEntry]) -> None:
    """Refuse a plan that would leave a layer list mostly whole (under :data:`MOSTLY_WHOLE` of
    its parameters sharded) while sharding entries under it match nothing and modules of their
    last name stay whole there (:class:`LayerCoverage` ``misaddressed``). Changes nothing.

    Raises:
        ConfigError: one line naming the layer list, the fraction, the misaddressed entries
            with the whole modules of their name, and the largest parts left whole.
    """
    for cov in layer_coverage(model, plan, entries):
        if not cov.misaddressed or cov.fraction >= MOSTLY_WHOLE:
            continue
        shown = "; ".join(f"'{entry}' (whole: {', '.join(there[:2])})"
                          for entry, there in cov.misaddressed[:3])
        more = (f" and {len(cov.misaddressed) - 3} more" if len(cov.misaddressed) > 3 else "")
        largest = ", ".join(f"{g} ({n / cov.total:.0%})" for g, n in cov.whole[:3])
        total = {id(p): p.numel() for p in model.parameters()}
        overall = sum(_sharded_ids(model, entries).values()) / max(1, sum(total.values()))
        raise ConfigError(
            f"the plan would shard only {cov.fraction:.0%} of the parameters of '{cov.path}' "
            f"({cov.sharded} of {cov.total}; {overall:.0%} of the whole model's): entries match "
            f"no module while modules of their name stay whole: {shown}{more}; largest parts "
            f"left whole: {largest}",
            path=cov.path, call="apply_schedule('auto')",
            hint="rename the entries (config.base_model_tp_plan / the model's _tp_plan) to the "
            "layers' module paths, or schedule this model by hand")
