"""How far the reduced-depth extrapolation is from simulating the whole model
(``python -m end2end.plan ... --check N``).

For the first ``N`` ranked candidates that were extrapolated, the full-depth model is simulated
too (the same run at its real layer count, minutes at paper scale) and the two predictions are
compared: samples/s and peak memory per rank, relative error of the extrapolation. The numbers
of a committed check are in docs/planning.md; ``tests/end2end/plan/test_predict.py`` checks a
small model on every run of the suite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from end2end.plan.predict import Prediction, predict, simulate_cached
from end2end.plan.search import PlanResult, SearchOptions
from end2end.plan.space import Candidate

__all__ = ["ExtrapolationCheck", "full_depth", "check_extrapolation", "check_lines"]


@dataclass
class ExtrapolationCheck:
    """One candidate's extrapolated and full-depth predictions."""

    candidate: Candidate
    extrapolated: Prediction
    full: Prediction

    def error(self, what: str) -> float:
        """Relative error of the extrapolation for ``samples_per_s`` or ``memory_gb``."""
        full = getattr(self.full, what)
        return (getattr(self.extrapolated, what) - full) / full if full else float("nan")


def full_depth(cand: Candidate, result: PlanResult, options: SearchOptions) -> Prediction:
    """The candidate simulated at the model's real depth."""
    spec = cand.run_spec()
    values = simulate_cached(spec, result.cluster, options.cache, options.timeout)
    return predict(cand, [(0, values)], result.cluster)


def check_extrapolation(result: PlanResult, count: int, options: SearchOptions
                        ) -> List[ExtrapolationCheck]:
    """The first ``count`` extrapolated candidates of ``result.ranked``, each against its
    full-depth simulation."""
    out: List[ExtrapolationCheck] = []
    for e in result.ranked:
        p = e.prediction
        if len(out) >= count:
            break
        if p is None or not p.depths or p.status not in ("sim", "sim-oom"):
            continue
        out.append(ExtrapolationCheck(e.candidate, p, full_depth(e.candidate, result, options)))
        last = out[-1]
        options.progress(f"checked {e.candidate.label}: samples/s "
                         f"{last.error('samples_per_s'):+.1%}, memory "
                         f"{last.error('memory_gb'):+.1%}")
    return out


def _seconds(p: Prediction) -> str:
    return f"{p.seconds:.0f}" if p.seconds else "cached"


def check_lines(checks: List[ExtrapolationCheck]) -> List[str]:
    """The check as a table: extrapolated vs full-depth samples/s and memory, errors."""
    if not checks:
        return ["extrapolation check: no extrapolated candidate to check"]
    out = ["extrapolation vs full depth: candidate | samples/s extrapolated / full (error) | "
           "GB per rank extrapolated / full (error) | simulation seconds reduced / full"]
    for c in checks:
        x, f = c.extrapolated, c.full
        out.append(f"  {c.candidate.label} | {x.samples_per_s:.4g} / {f.samples_per_s:.4g} "
                   f"({c.error('samples_per_s'):+.1%}) | {x.memory_gb:.4g} / {f.memory_gb:.4g} "
                   f"({c.error('memory_gb'):+.1%}) | {_seconds(x)} / {_seconds(f)}")
    return out
