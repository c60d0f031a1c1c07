"""The search: the space pruned by rules, ranked by the analytical estimate, simulated in that
order within a time budget, and ranked again by the simulator's predictions.

:func:`plan` is the planner's API (``python -m end2end.plan`` prints what it returns):

1. every candidate (:func:`end2end.plan.space.enumerate_space`), pruned by the rules;
2. the survivors ordered by the estimate (:mod:`end2end.plan.estimate`): those estimated to
   fit first, then by estimated samples/s. The estimate cannot tell a Slapo mode from its
   baseline (the same layout estimates the same), so the simulation queue first takes
   :data:`PER_MODE_FIRST` candidates of every mode, round robin, then the rest in estimate
   order. Each of those is, among the mode's candidates estimated within
   :data:`CHEAP_WITHIN` of its best, the one with the fewest pipeline stages: every stage is a
   simulated role, so a deep pipeline costs several times a flat layout to simulate;
3. simulations (:mod:`end2end.plan.predict`, ``jobs`` candidates at a time, each in worker
   processes of its own) until the queue is empty or
   ``max_candidates`` are simulated; a candidate whose simulation would overrun ``budget_s``
   (guessed from those before it, per pipeline stage) is left out. A candidate
   predicted out of memory prunes, unsimulated, every candidate of its mode and layout that
   holds as much or more: the same or a larger micro-batch, no more recomputation and no
   sequence parallelism where the OOM had it; while
   no candidate of its mode fits yet, the mode's next candidate moves up to just after the
   other modes' first candidates still queued;
4. the simulated candidates ranked: those predicted to fit, by predicted samples/s.

The space is enumerated whole and each point is cheap to estimate, so the analytical model
plays the part a model-based sampler (Optuna's TPE, ``slapo.autotune``) would learn over many
trials: with a simulation costing a minute, the budget holds tens of trials, too few to learn
from.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from slapo.errors import ConfigError

from end2end.models import get_model_spec
from end2end.plan.cluster import Cluster
from end2end.plan.estimate import estimate_memory, estimate_seconds
from end2end.plan.limits import NO_LIMITS, SpaceLimits
from end2end.plan.predict import (REDUCE_ABOVE, Prediction, predict, reduced_models,
                                  simulate_cached)
from end2end.plan.shapes import with_size
from end2end.plan.ckpt import holds_at_least, holds_at_least_knobs
from end2end.plan.space import PLANNED_MODES, Candidate, Space, enumerate_space

__all__ = ["Evaluated", "PlanResult", "SearchOptions", "plan", "PER_MODE_FIRST", "DEFAULT_CACHE",
           "default_batch", "resolve_model"]

PER_MODE_FIRST = 2
FIT_MARGIN = 0.85
CHEAP_WITHIN = 1.15
DEFAULT_CACHE = Path.home() / ".cache" / "slapo" / "plan"


@dataclass
class Evaluated:
    """A candidate with its estimate and (once simulated) its prediction."""

    candidate: Candidate
    estimate: Dict[str, float]
    estimated_gb: float
    prediction: Optional[Prediction] = None


@dataclass
class PlanResult:
    """What :func:`plan` found (``ranked``: simulated candidates, best first)."""

    model: str
    cluster: Cluster
    seq: int
    batch: int
    dtype: str
    space: Space
    ranked: List[Evaluated]
    skipped_after_oom: int
    not_simulated: int
    simulations: int
    cached: int
    wall_s: float
    notes: List[str] = field(default_factory=list)

    @property
    def fitting(self) -> List[Evaluated]:
        return [e for e in self.ranked if e.prediction and e.prediction.fits]

    @property
    def best(self) -> Optional[Evaluated]:
        return self.fitting[0] if self.fitting else None

    @property
    def best_baseline(self) -> Optional[Evaluated]:
        return next((e for e in self.fitting if not e.candidate.is_slapo), None)


def default_batch(cluster: Cluster) -> int:
    """The global batch when none is given: 4 samples per device."""
    return 4 * cluster.gpus


def resolve_model(model: str, seq: int, folder: Path) -> Tuple[str, List[str]]:
    """``model``, or its shape with ``max_positions`` raised to ``seq`` when the model has fewer
    positions (a LLaMA-7B at 4096); the notes saying so."""
    spec = get_model_spec(model)
    if spec.is_vision or seq <= spec.max_positions:
        return model, []
    longer = with_size(model, "max_positions", seq, folder)
    if longer is None:
        raise ConfigError(f"model {model!r} has {spec.max_positions} positions, fewer than "
                          f"--seq {seq}", call="end2end.plan", hint="shorten --seq")
    return longer, [f"{model} has {spec.max_positions} positions: planned as {longer}"]


def _queue(items: List[Evaluated], capacity: float) -> List[Evaluated]:
    """Simulation order (module docstring, step 2); "estimated to fit" keeps
    :data:`FIT_MARGIN` of the capacity free (the estimate is rough)."""
    order = sorted(items, key=lambda e: (e.estimated_gb * 1e9 > FIT_MARGIN * capacity,
                                         e.estimate["total"]))
    first: List[Evaluated] = []
    for _ in range(PER_MODE_FIRST):
        for mode in PLANNED_MODES:
            of_mode = [e for e in order if e.candidate.mode == mode
                       and all(e is not f for f in first)]
            if of_mode:  # within CHEAP_WITHIN of the mode's best estimate, the fewest stages
                near = [e for e in of_mode
                        if e.estimate["total"] <= CHEAP_WITHIN * of_mode[0].estimate["total"]]
                first.append(min(near, key=lambda e: e.candidate.pp))
    return first + [e for e in order if all(e is not f for f in first)]


def _dominated_by_oom(cand: Candidate, oom: Candidate) -> bool:
    return (cand.mode, cand.tp, cand.pp) == (oom.mode, oom.tp, oom.pp) \
        and cand.micro >= oom.micro and holds_at_least(cand.ckpt, oom.ckpt) \
        and holds_at_least_knobs(cand.knobs, oom.knobs)


def _next_of_mode_first(queue: List[Evaluated], mode: str, done: List[Evaluated],
                        ooms: List[Candidate], first: int = 0) -> None:
    """After a predicted OOM of ``mode`` while no candidate of it fits yet, move its next
    candidate that the OOM does not prune to position ``first`` (after the other modes' first
    candidates still queued: every mode gets a fitting layout early, the best baseline
    included)."""
    if any(e.candidate.mode == mode and e.prediction and e.prediction.fits for e in done):
        return
    for i, e in enumerate(queue):
        if e.candidate.mode == mode and not any(_dominated_by_oom(e.candidate, o) for o in ooms):
            queue.insert(min(first, i), queue.pop(i))
            return


@dataclass
class _Budget:
    """The time left; a candidate's simulation is guessed from those before it, per pipeline
    stage (every stage is a simulated role: a deep pipeline costs more)."""

    seconds: float
    max_candidates: Optional[int]
    began: float = field(default_factory=time.perf_counter)
    per_stage: List[float] = field(default_factory=list)  # wall seconds / stages, per candidate
    started: int = 0

    def allows(self, cand: Candidate) -> bool:
        if self.max_candidates is not None and self.started >= self.max_candidates:
            return False
        guess = max(self.per_stage, default=0.0) * cand.pp
        return time.perf_counter() - self.began + guess <= self.seconds

    def record(self, cand: Candidate, seconds: float) -> None:
        self.per_stage.append(seconds / cand.pp)


class _Search:
    """The simulation loop (module docstring, step 3): ``jobs`` candidates at a time."""

    def __init__(self, queue: List[Evaluated], cluster: Cluster, options: "SearchOptions",
                 folder: Path):
        self.queue, self.cluster, self.o, self.folder = queue, cluster, options, folder
        self.budget = _Budget(options.budget_s, options.max_candidates)
        self.done: List[Evaluated] = []
        self.ooms: List[Candidate] = []
        self.skipped = self.sims = self.hits = self.over_budget = 0
        self.first_round = {id(e) for e in queue[:len(options.modes)]}

    def _next(self) -> Optional[Evaluated]:
        while self.queue:
            item = self.queue.pop(0)
            if any(_dominated_by_oom(item.candidate, oom) for oom in self.ooms):
                self.skipped += 1
            elif not self.budget.allows(item.candidate):
                self.over_budget += 1
            else:
                self.budget.started += 1
                return item
        return None

    def _simulate(self, item: Evaluated) -> float:
        """Simulate one candidate (its reduced copies one after the other); wall seconds."""
        began, cand = time.perf_counter(), item.candidate
        models = reduced_models(cand, self.folder, self.o.reduce_above)
        runs = [(k, simulate_cached(cand.run_spec(model=name), self.cluster, self.o.cache,
                                    self.o.timeout)) for k, name in models]
        item.prediction = predict(cand, runs, self.cluster)
        self.sims += len(runs)
        self.hits += sum(1 for _, v in runs if v.get("_seconds") == 0.0)
        return time.perf_counter() - began

    def _record(self, item: Evaluated, seconds: float) -> None:
        self.budget.record(item.candidate, seconds)
        self.done.append(item)
        p = item.prediction
        assert p is not None
        if p.status == "sim-oom":
            self.ooms.append(item.candidate)
            first = sum(1 for e in self.queue if id(e) in self.first_round)
            _next_of_mode_first(self.queue, item.candidate.mode, self.done, self.ooms, first)
        self.o.progress(f"[{len(self.done)}] {item.candidate.label}: {p.status} "
                        f"{p.samples_per_s:.4g} samples/s, {p.memory_gb:.3g} GB ({seconds:.0f} s)")

    def run(self) -> List[Evaluated]:
        """Simulate until the queue is empty; the simulated candidates."""
        jobs = max(1, self.o.jobs)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            running: Dict[Future, Evaluated] = {}
            while True:
                while len(running) < jobs:
                    item = self._next()
                    if item is None:
                        break
                    running[pool.submit(self._simulate, item)] = item
                if not running:
                    return self.done
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in finished:
                    self._record(running.pop(future), future.result())


def _rank_key(e: Evaluated) -> Tuple[bool, float]:
    p = e.prediction
    return (True, 0.0) if p is None else (not p.fits, -p.samples_per_s)


@dataclass(frozen=True)
class SearchOptions:
    """How :func:`plan` searches: ``budget_s`` seconds of simulation, ``jobs`` simulations at a
    time, at most ``max_candidates`` simulated, ``cache`` (``None``: simulate everything),
    ``timeout`` seconds per simulation, the ``modes`` searched, ``progress`` called with a
    line per simulated candidate, ``reduce_above``: layers per stage above which a candidate
    is simulated at reduced depth (:func:`end2end.plan.predict.reduced_models`), ``limits``:
    the CKPT values, TP, PP and accumulation steps searched where given
    (:class:`end2end.plan.limits.SpaceLimits`)."""

    budget_s: float = 600.0
    jobs: int = 2
    max_candidates: Optional[int] = None
    cache: Optional[Path] = DEFAULT_CACHE
    timeout: float = 600.0
    modes: Tuple[str, ...] = PLANNED_MODES
    progress: Callable[[str], None] = field(default=lambda text: None)
    reduce_above: int = REDUCE_ABOVE
    limits: SpaceLimits = NO_LIMITS


def plan(model: str, cluster: Cluster, seq: int, batch: Optional[int] = None,
         dtype: Optional[str] = None, dec: int = 0,
         options: SearchOptions = SearchOptions()) -> PlanResult:
    """Plan ``model`` on ``cluster`` (module docstring); ``cache=None`` simulates everything."""
    began, o = time.perf_counter(), options
    folder = o.cache or DEFAULT_CACHE
    model, notes = resolve_model(model, seq, folder)
    batch, dtype = batch or default_batch(cluster), dtype or cluster.default_dtype()
    space = enumerate_space(model, cluster, seq, batch, dtype, dec, o.modes, o.limits)
    if not space.candidates:
        reasons = "; ".join(f"{k}: {space.examples[k]}" for k in space.pruned)
        raise ConfigError(f"{model} fits no layout on {cluster.text} at seq {seq}, batch "
                          f"{batch} ({reasons or 'no candidate'})", call="end2end.plan",
                          hint="use more or larger devices, a smaller --global-batch or --seq")
    items = [Evaluated(c, estimate_seconds(c, cluster), estimate_memory(c, cluster) / 1e9)
             for c in space.candidates]
    search = _Search(_queue(items, cluster.capacity_bytes), cluster, o, folder)
    done = search.run()
    ranked = sorted(done, key=_rank_key)
    notes += [cluster.note] if cluster.note else []
    return PlanResult(model, cluster, seq, batch, dtype, space, ranked, search.skipped,
                      search.over_budget, search.sims, search.hits,
                      time.perf_counter() - began, notes)
