"""The "auto" schedule on EVERY causal-LM family of ``transformers.CONFIG_MAPPING`` that declares
a tensor-parallel plan, at TP 2 on gloo: each family ends ``ok`` (trains like the unscheduled
model, ``test_auto_families.check_auto``), ``refused`` (a ``ConfigError`` naming the plan entry
and why) or ``wrong`` / ``broken`` (anything else: a mismatch, or an unexpected exception).

Slow (minutes): runs with ``SLAPO_SLOW_TESTS=1``, or as a script that prints the table::

    .venv/bin/python -m tests.model_schedule.test_auto_sweep [family ...]
"""

import os
import sys
from typing import Dict, List, Sequence

import pytest

from slapo.testing import run_distributed
from tests.model_schedule.test_auto_families import check_families


def plan_families() -> List[str]:
    """Every ``model_type`` with a causal-LM class whose config class carries a plan."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return [m for m in sorted(CONFIG_MAPPING.keys()) if m in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and getattr(CONFIG_MAPPING[m], "base_model_tp_plan", None)]


def verdict(result: str) -> str:
    """``ok`` / ``refused`` (a ConfigError) / ``wrong`` (a numerical mismatch) / ``broken``."""
    if result == "ok":
        return "ok"
    if result.startswith("ConfigError"):
        return "refused"
    if result.startswith("AssertionError"):
        return "wrong"
    return "broken"


def _sweep_rank(families: Sequence[str], progress: bool) -> Dict[str, str]:
    import torch.distributed as dist

    results = {}
    for family in families:
        results.update(check_families([family]))
        if progress and dist.get_rank() == 0:
            print(f"{family}\t{verdict(results[family])}\t"
                  f"{results[family].splitlines()[0][:300] if results[family] != 'ok' else ''}",
                  flush=True)
    return results


def sweep(families: Sequence[str], world_size: int = 2, progress: bool = False
          ) -> Dict[str, str]:
    """family -> result of ``check_families`` at TP ``world_size`` (``progress``: rank 0
    prints each family's line as it finishes)."""
    return run_distributed(_sweep_rank, world_size, list(families), progress,
                           timeout=3 * 3600)[0]


@pytest.mark.skipif(os.environ.get("SLAPO_SLOW_TESTS") != "1",
                    reason="slow: set SLAPO_SLOW_TESTS=1")
def test_every_family_with_a_plan_is_ok_or_refused():
    results = sweep(plan_families())
    bad = {f: r for f, r in results.items() if verdict(r) not in ("ok", "refused")}
    assert not bad, bad


def main(argv: Sequence[str]) -> int:
    families = list(argv) or plan_families()
    results = sweep(families, progress=True)
    return 0 if all(verdict(r) in ("ok", "refused") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
