"""Reading a HuggingFace tensor-parallel plan and resolving it against a model's paths.

:func:`read_plan` joins the config's ``base_model_tp_plan`` (globs relative to the base model)
and the model class's ``_tp_plan``; :func:`resolve_plan` expands every glob over the model's
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

__all__ = ["PlanEntry", "read_plan", "resolve_plan", "plan_error"]


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


def read_plan(model: nn.Module) -> Dict[str, str]:
    """The model's tensor-parallel plan, globs relative to ``model``: the config class's
    ``base_model_tp_plan`` under the base-model prefix (``model.`` for ``LlamaForCausalLM``),
    then the model class's own ``_tp_plan`` (``lm_head``). Empty when the model declares none.
    A ``base_model_tp_plan`` set on the config instance overrides the class's."""
    config = getattr(model, "config", None)
    base = dict(getattr(config, "base_model_tp_plan", None) or {})  # instance overrides class
    prefix = getattr(model, "base_model_prefix", "") or ""
    if not (prefix and isinstance(getattr(model, prefix, None), nn.Module)):
        prefix = ""  # the model is the base model itself
    plan = {C.join(prefix, glob): style for glob, style in base.items()}
    plan.update(dict(getattr(type(model), "_tp_plan", None) or {}))
    return plan


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
