"""The planner's picks against the measured grid (``python -m end2end.plan.cpu_study``): the
comparison, its Markdown report and its JSON summary.

Per candidate of the grid, what was measured (:class:`end2end.plan.measured.Measured`) beside
what the planner predicted, where it simulated the candidate. The planner's picks are its
``top`` best candidates predicted to fit. The issue's goals (#40, item 4):

* the best measured pick is within :data:`GOAL_WITHIN` (5 %) of the best measured candidate of
  the whole grid (``ratio`` >= 0.95); a pick that was not measured, or a grid with unmeasured
  candidates, is said so beside the verdict;
* the picks are at most :data:`GOAL_SHARE` (a quarter) of the grid's measurements.

A ratio whose rounds overlap the grid best's (the pick's fastest round at least the best's
slowest) is also "within noise" (design: headline ratios from interleaved rounds).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from end2end.plan.measured import UNMEASURED, Measured
from end2end.plan.predict import Prediction
from end2end.plan.search import Evaluated
from end2end.plan.space import Candidate

__all__ = ["GOAL_WITHIN", "GOAL_SHARE", "StudyRow", "Comparison", "compare", "name",
           "markdown", "summary"]

GOAL_WITHIN = 0.05
GOAL_SHARE = 0.25


def name(c: Candidate) -> str:
    """A candidate's short name with its global batch: ``slapo-megatron tp2 pp1 dp1 mb4
    ckpt=0.5 b=8``."""
    return f"{c.label} b={c.batch}"


@dataclass
class StudyRow:
    """One candidate: measured, and predicted where the planner simulated it (``rank``: its
    place in the planner's merged ranking, 1-based)."""

    candidate: Candidate
    measured: Measured
    prediction: Optional[Prediction] = None
    rank: Optional[int] = None


@dataclass
class Comparison:
    """The grid (in grid order), the planner's picks (in its order) and the verdicts."""

    rows: List[StudyRow]
    picks: List[StudyRow]
    top: int

    @property
    def measured(self) -> List[StudyRow]:
        return [r for r in self.rows if r.measured.status != UNMEASURED]

    @property
    def unmeasured(self) -> List[StudyRow]:
        return [r for r in self.rows if r.measured.status == UNMEASURED]

    @property
    def best_grid(self) -> Optional[StudyRow]:
        fitting = [r for r in self.rows if r.measured.fits]
        return max(fitting, key=lambda r: r.measured.thrpt, default=None)

    @property
    def best_pick(self) -> Optional[StudyRow]:
        fitting = [r for r in self.picks if r.measured.fits]
        return max(fitting, key=lambda r: r.measured.thrpt, default=None)

    @property
    def ratio(self) -> Optional[float]:
        """Best measured pick / best measured candidate of the grid (0 when no pick fits)."""
        best = self.best_grid
        if best is None:
            return None
        pick = self.best_pick
        return pick.measured.thrpt / best.measured.thrpt if pick else 0.0

    @property
    def within(self) -> Optional[bool]:
        """The first goal: met, not met, or ``None`` (no fitting measurement at all, or not met
        while a pick is unmeasured: it might have been the one)."""
        if self.ratio is None:
            return None
        met = self.ratio >= 1 - GOAL_WITHIN
        if not met and any(p.measured.status == UNMEASURED for p in self.picks):
            return None
        return met

    @property
    def within_noise(self) -> bool:
        """Whether the best pick is another candidate than the grid's best and its rounds reach
        the grid best's slowest round."""
        best, pick = self.best_grid, self.best_pick
        return bool(best and pick and pick is not best
                    and pick.measured.thrpt_max >= best.measured.thrpt_min)

    @property
    def share(self) -> float:
        """The picks' share of the grid's measurements."""
        return len(self.picks) / len(self.rows) if self.rows else 0.0


def compare(grid: Sequence[Candidate], ranked: Sequence[Evaluated],
            measured: Dict[Candidate, Measured], top: int) -> Comparison:
    """The :class:`Comparison` of the planner's ``ranked`` candidates (best first) with the
    grid's measurements."""
    predicted = {e.candidate: (e.prediction, i) for i, e in enumerate(ranked, start=1)}
    rows = {c: StudyRow(c, measured.get(c, Measured(UNMEASURED)), *predicted.get(c, (None, None)))
            for c in grid}
    picks = [e.candidate for e in ranked if e.prediction and e.prediction.fits][:top]
    for c in picks:  # a pick outside the grid (never expected) is still compared
        rows.setdefault(c, StudyRow(c, measured.get(c, Measured(UNMEASURED)),
                                    *predicted[c]))
    return Comparison(list(rows.values()), [rows[c] for c in picks], top)


def _met(ok: Optional[bool]) -> str:
    return "not judged" if ok is None else ("met" if ok else "**not met**")


def _thrpt(m: Measured) -> str:
    if not m.fits:
        return m.status
    return f"{m.thrpt:.4g} ({m.thrpt_min:.4g}-{m.thrpt_max:.4g})"


def _predicted(p: Optional[Prediction]) -> str:
    if p is None:
        return "-"
    return f"{p.samples_per_s:.4g}" if p.fits else p.status


def _verdict_lines(c: Comparison) -> List[str]:
    best, pick = c.best_grid, c.best_pick
    out = [f"Best measured over the grid: {name(best.candidate)}, {_thrpt(best.measured)} "
           f"samples/s." if best else "No candidate of the grid fits as measured."]
    out.append(f"Best measured of the planner's top {c.top}: {name(pick.candidate)}, "
               f"{_thrpt(pick.measured)} samples/s." if pick else
               f"None of the planner's top {c.top} fits as measured.")
    if c.ratio is not None:
        noise = " (their rounds overlap: within noise)" if c.within_noise else ""
        out.append(f"Ratio: {c.ratio:.3f}{noise} (goal >= {1 - GOAL_WITHIN:.2f}: "
                   f"{_met(c.within)}).")
    missing = [p for p in c.picks if p.measured.status == UNMEASURED]
    if missing:
        names = ", ".join(name(p.candidate) for p in missing)
        out.append(f"Not measured among the picks: {names}.")
    if c.unmeasured:
        out.append(f"The grid has {len(c.unmeasured)} unmeasured candidates: the best over the "
                   "grid is the best of those measured.")
    out.append(f"Measurements the planner needs: its picks, {len(c.picks)} of the grid's "
               f"{len(c.rows)} candidates = {c.share:.1%} (goal <= {GOAL_SHARE:.0%}: "
               f"{_met(c.share <= GOAL_SHARE)}).")
    return out


def _picks_table(c: Comparison) -> List[str]:
    out = ["| rank | candidate | predicted samples/s | measured samples/s (rounds) | error | "
           "predicted GB/rank | measured GB/rank |", "|---|---|---|---|---|---|---|"]
    for r in c.picks:
        p, m = r.prediction, r.measured
        assert p is not None
        error = f"{p.samples_per_s / m.thrpt - 1:+.0%}" if m.fits and m.thrpt else "-"
        mem = f"{m.memory_gb:.3f}" if m.memory_gb else "-"
        out.append(f"| {r.rank} | {name(r.candidate)} | {p.samples_per_s:.4g} | "
                   f"{_thrpt(m)} | {error} | {p.memory_gb:.3f} | {mem} |")
    return out


def _grid_table(c: Comparison) -> List[str]:
    def order(r: StudyRow):
        m = r.measured
        return (not m.fits, m.status == UNMEASURED, -m.thrpt)

    out = ["| candidate | measured samples/s (rounds) | GB/rank | status | planner rank | "
           "predicted samples/s |", "|---|---|---|---|---|---|"]
    for r in sorted(c.rows, key=order):
        m = r.measured
        mem = f"{m.memory_gb:.3f}" if m.memory_gb else "-"
        status = m.status + (f": {m.error}" if m.error else "")
        out.append(f"| {name(r.candidate)} | {_thrpt(m)} | {mem} | {status} | "
                   f"{r.rank or '-'} | {_predicted(r.prediction)} |")
    return out


def markdown(c: Comparison, title: str, context: Sequence[str], command: str, machine: str,
             commit: str) -> str:
    """The report: title, date, machine, commit and command, ``context`` lines (what was
    planned and measured), the verdicts, the picks' table and the grid's."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# {title}", "", f"{when}, {machine}, commit {commit}", "", f"    {command}", ""]
    lines += list(context) + [""] + _verdict_lines(c) + ["", f"## The planner's top {c.top}: "
                                                         "predicted vs measured", ""]
    lines += _picks_table(c) + ["", "## The grid", ""] + _grid_table(c)
    return "\n".join(lines) + "\n"


def summary(c: Comparison) -> Dict[str, Any]:
    """The numbers of the report as one JSON object (``DIR/study.json``)."""
    def row(r: Optional[StudyRow]) -> Optional[Dict[str, Any]]:
        if r is None:
            return None
        m, p = r.measured, r.prediction
        return dict(name=name(r.candidate), line=r.candidate.line, status=m.status,
                    thrpt=m.thrpt, thrpt_min=m.thrpt_min, thrpt_max=m.thrpt_max,
                    memory_gb=m.memory_gb, rounds=m.rounds, rank=r.rank,
                    predicted=p.samples_per_s if p else None,
                    predicted_status=p.status if p else None,
                    predicted_gb=p.memory_gb if p else None)

    return dict(grid=len(c.rows), measured=len(c.measured), unmeasured=len(c.unmeasured),
                fitting=sum(r.measured.fits for r in c.rows), top=c.top,
                best_grid=row(c.best_grid), best_pick=row(c.best_pick), ratio=c.ratio,
                within=c.within, within_noise=c.within_noise, share=c.share,
                share_met=c.share <= GOAL_SHARE, picks=[row(p) for p in c.picks],
                candidates=[row(r) for r in c.rows])
