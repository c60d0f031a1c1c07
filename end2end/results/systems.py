"""Which system a results row is, and how the tables and figures name, colour and pair it:
everything about a system comes from the table of modes (:mod:`end2end.spec.modes`); a run with
recipe knobs or a pipeline is a system of its own (``"slapo [fuse_bias_gelu=True]"``).
:mod:`end2end.results.summary` aggregates the rows of each system into Figure 7's bars.
"""

from __future__ import annotations

from typing import List, Tuple

from end2end.results.store import ResultRow
from end2end.spec.modes import FIGURE7_GROUPS, MODE_TABLE

__all__ = ["SYSTEMS", "GROUPS", "PAIRS", "BASELINES", "LABEL", "COLOR", "PIPELINE_LABEL",
           "system_of", "base_system", "label_of", "is_slapo_system", "baselines_of",
           "model_label"]

# Everything about a system comes from the table of modes (end2end/spec/modes.py):
# (impl, legend label, colour) per mode, in the table's order.
SYSTEMS: Tuple[Tuple[str, str, str], ...] = tuple((m.name, m.label, m.color)
                                                 for m in MODE_TABLE.values())
# Panels show a group of systems when the model has a row of any system in it (then a missing
# member, e.g. Megatron-LM for RoBERTa, gets a grey "x"): the Figure-7 four, and the CPU pair.
GROUPS = FIGURE7_GROUPS
# (Slapo system, its baseline); a Slapo bar is labelled with the first baseline of its panel
PAIRS = tuple((m.name, base) for m in MODE_TABLE.values() for base in m.baselines)
BASELINES = tuple(m.name for m in MODE_TABLE.values() if not m.slapo)
LABEL = {impl: label for impl, label, _ in SYSTEMS}
COLOR = {impl: color for impl, _, color in SYSTEMS}


def model_label(name: str) -> str:
    """The zoo's label of model ``name`` (``BERT (CPU)``), or the name itself when the zoo
    cannot say (no torch here, or a model it does not know)."""
    try:
        from end2end.models import get_model_spec

        return get_model_spec(name).label
    except (ImportError, LookupError):  # no torch here, or a model not in the zoo
        return name


def system_of(row: ResultRow) -> str:
    """The bar a row belongs to: its mode, or ``"mode [knobs]"`` for a run with recipe knobs
    (``#@ knobs=``) or a pipeline (``pp=N``, N > 1), which is a system of its own."""
    extra = ",".join(filter(None, [f"pp={row.pp}" if (row.pp or 1) > 1 else "", row.knobs]))
    return f"{row.impl} [{extra}]" if extra else row.impl


def base_system(system: str) -> str:
    """``"slapo [fuse=False]"`` -> ``"slapo"``."""
    return system.split(" [", 1)[0]


# a mode whose runtime is another one under a pipeline: slapo-deepspeed with pp > 1 runs on
# DeepSpeed's pipeline engine, not ZeRO-3
PIPELINE_LABEL = {"slapo-deepspeed": "Slapo-DeepSpeed"}


def label_of(system: str) -> str:
    """Legend label: ``Slapo``, ``Slapo [fuse_bias_gelu=True]``, ``Slapo-DeepSpeed [pp=2]``."""
    base = base_system(system)
    label = LABEL.get(base, base)
    if "pp=" in system[len(base):]:
        label = PIPELINE_LABEL.get(base, label)
    return label + system[len(base):]


def is_slapo_system(system: str) -> bool:
    """A bar of a Slapo mode (with or without knobs); rows of modes this version does not know
    are not."""
    mode = MODE_TABLE.get(base_system(system))
    return mode is not None and mode.slapo


def baselines_of(system: str) -> List[str]:
    """The baselines a Slapo system (with or without knobs) is compared with (``PAIRS``)."""
    return [den for num, den in PAIRS if num == base_system(system)]
