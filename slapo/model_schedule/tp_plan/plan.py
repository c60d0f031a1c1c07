"""Reading a HuggingFace tensor-parallel plan and resolving it against a model's paths.

:func:`read_plan` collects the plan as transformers resolves it (every HF model module's class
``_tp_plan`` and its config's ``base_model_tp_plan``, under the module's real path);
:func:`check_plan_paths` refuses an entry that addresses a path the model lacks;
:func:`resolve_plan` expands every glob over the model's
module and parameter names into :class:`PlanEntry` rows, in module order. Nothing here knows
what a style means: that is :mod:`.styles`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional

from torch import nn

from ...errors import ConfigError
from .. import common as C

__all__ = ["PlanEntry", "read_plan", "resolve_plan", "plan_error", "check_plan_paths", "prefix_of"]


@dataclasses.dataclass(frozen=True)
class PlanEntry:
    """One resolved plan entry: ``glob`` as written (with the base-model prefix), its
    ``style``, the module ``path`` it names, and ``param`` when it names a parameter of that
    module instead of the module itself."""

    glob: str
    style: str
    path: str
    param: Optional[str] = None

    @property
    def target(self) -> str:
        """The full dotted name the entry addresses (module or parameter)."""
        return C.join(self.path, self.param or "")

    def describe(self) -> str:
        """``plan entry '<glob>: <style>' (at '<target>')``, the start of every error about it."""
        return f"plan entry '{self.glob}: {self.style}' (at '{self.target}')"


def _pretrained(mod: nn.Module) -> bool:
    return hasattr(mod, "config") and hasattr(mod, "base_model_prefix") and hasattr(
        type(mod), "_tp_plan")


def read_plan(model: nn.Module) -> Dict[str, str]:
    """The model's tensor-parallel plan as transformers resolves it (``init_parallel_plans``),
    globs relative to ``model`` and following its real module paths: every HF model module
    at path ``p`` contributes its class's ``_tp_plan`` under ``p`` and, where it is the base
    model of its config (no HF model below it shares that config), the config's
    ``base_model_tp_plan`` under ``p`` (read from the config instance: an override set on it
    wins). So the text sub-config's plan of a vision-language model lands under
    ``model.language_model``, and Llama 4's under its real child ``model`` whatever
    ``base_model_prefix`` says. Like transformers, a base model with an ``embed_tokens``
    embedding that its plan does not name gets ``embed_tokens: embedding_rowwise`` (T5Gemma's
    decoder embedding). Empty when the model declares none."""
    plan: Dict[str, str] = {}
    modules = [(path, mod) for path, mod in model.named_modules() if _pretrained(mod)]
    for path, mod in modules:
        own = dict(type(mod)._tp_plan or {})
        below = [m for p, m in modules if p.startswith(path + ".") or (not path and p)]
        if not any(m.config is mod.config for m in below):  # else the base model below adds it
            own.update(dict(getattr(mod.config, "base_model_tp_plan", None) or {}))
        if own and getattr(mod, "base_model", None) is mod and isinstance(
                getattr(mod, "embed_tokens", None), nn.Embedding):
            own = {"embed_tokens": "embedding_rowwise", **own}  # as transformers adds it
        plan.update({C.join(path, g): s for g, s in own.items()})
    return plan


def prefix_of(glob: str) -> str:
    """The fixed part of ``glob`` that must name a module: before its first ``*`` (without
    the trailing dot), or its parent path when it has none."""
    head, star, _ = glob.partition("*")
    return head.rstrip(".") if star else glob.rpartition(".")[0]


def check_plan_paths(model: nn.Module, plan: Dict[str, str]) -> None:
    """Refuse a plan entry whose fixed prefix (:func:`prefix_of`) names no module of
    ``model``: it addresses a model structure that is not there, and applying the rest would
    leave its part silently unsharded. (An entry under an existing layer list that matches no
    layer is fine: a layer kind this configuration does not use.)

    Raises:
        ConfigError: naming the entry and the closest existing path.
    """
    from ...primitives.module_checks import closest

    names = [name for name, _ in model.named_modules()]
    known = set(names)
    for glob, style in plan.items():
        prefix = prefix_of(glob)
        if prefix and prefix not in known:
            raise ConfigError(
                f"plan entry '{glob}: {style}' matches nothing: '{prefix}' is not a module "
                f"of {type(model).__name__}", path=prefix, call="apply_schedule('auto')",
                hint=f"{closest(prefix, names)} Fix the plan (config.base_model_tp_plan / "
                "_tp_plan) to the model's module paths")


def _glob_regex(glob: str) -> "re.Pattern[str]":
    return re.compile("^" + r"\.".join("[^.]+" if part == "*" else re.escape(part)
                                       for part in glob.split(".")) + "$")


def resolve_plan(model: nn.Module, plan: Dict[str, str]) -> List[PlanEntry]:
    """Expand every glob of ``plan`` over the model's module and parameter names (``*`` = one
    path part, e.g. a layer index), in the model's module order. Globs that match nothing (a
    layer kind this model lacks, a tied ``lm_head``...) are dropped."""
    modules = [name for name, _ in model.named_modules()]
    params = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    entries: List[PlanEntry] = []
    for glob, style in plan.items():
        regex = _glob_regex(glob)
        hits = [PlanEntry(glob, style, m) for m in modules if regex.match(m)]
        if not hits:
            hits = [PlanEntry(glob, style, *p.rpartition(".")[::2])
                    for p in params if regex.match(p)]
        entries += hits
    order = {name: i for i, name in enumerate(modules)}
    return sorted(entries, key=lambda e: (order.get(e.path, -1), e.param or ""))


def plan_error(entry: PlanEntry, why: str, hint: str, mod: Optional[nn.Module] = None
               ) -> ConfigError:
    """The ``ConfigError`` for a plan entry Slapo cannot honour."""
    return ConfigError(f"{entry.describe()}: {why}", path=entry.target,
                       call="apply_schedule('auto')", module=mod, hint=hint)
