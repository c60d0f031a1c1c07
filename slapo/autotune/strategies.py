"""Search strategies: exhaustive grid, the original's OOM-aware search, and Optuna's TPE.

Each strategy is a callable ``strategy(tuner)`` that asks :meth:`Tuner.evaluate` for candidates
until it is done or the budget runs out (:class:`~slapo.autotune.study.BudgetExhausted`).

* :class:`Grid` evaluates every valid candidate in enumeration order: the ground truth.
* :class:`OOMAwareSearch` is the paper's tuner over a batch size and a checkpoint ratio (other
  symbols: searched one combination after another). It assumes what makes the search cheap:
  memory grows with the batch and shrinks with the ratio, and a larger batch and a smaller ratio
  (less recomputation) are faster. (1) Largest batch that fits at the largest ratio: the
  largest batch first, then a binary search. (2) For each batch from there down, a binary
  search for the smallest ratio that fits, bounded by what is already known. (3) Early stop
  after ``patience`` evaluations in a row that ran but did not improve the best throughput.
  Fixed quirks of the original: a candidate that is *proven* to OOM (a candidate with a batch at
  most its batch and a ratio at least its ratio ran out of memory) is never evaluated; each
  binary search starts from the bounds that the stored results prove, not from the previous
  search's midpoint; a failure that is not an OOM is no proof of anything (it is only "does not
  fit" for the current binary search), and an OOM is never confused with a failed run; an OOM
  does not count towards the early stop (the original counted it as a zero throughput, so it
  stopped while still locating the memory boundary: it only says where the boundary is).
* :class:`TPE` is Optuna's ``TPESampler`` (seeded, multivariate; ``n_startup_trials`` random
  proposals first, by default ``max(3, min(10, budget // 8))``: few, because a tuning budget is
  tens of candidates) over the symbols; ``int``/``float`` symbols are numbers to it, so it
  models their order. An ``oom`` candidate is told to Optuna as infeasible. Proposals
  that violate a constraint are stored as ``invalid`` (and told to Optuna as infeasible), a
  proposal evaluated before is stored as a ``duplicate`` with the earlier outcome (nothing runs);
  after ``max_repeats`` such proposals in a row the next candidate is a random unevaluated one
  (seeded), so the budget is spent on new candidates.

With a :class:`~slapo.autotune.predict.PredictionPolicy` that ranks, the grid evaluates in the
predicted order, TPE's startup candidates are the head of that order instead of random ones, and
the search first probes the head (the candidate predicted fastest within the memory budget; its
planes of other symbols in the order of their best prediction). Candidates the policy prunes are
never run; the search takes them as OOM proofs only when the policy trusts predicted OOMs
(``trust_oom``), else a pruned candidate only "does not fit" for the binary search that met it.
"""

from __future__ import annotations

import itertools
import random
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import TuneError
from .space import Params
from .study import Record, Tuner

__all__ = ["Grid", "OOMAwareSearch", "TPE", "STRATEGIES", "make_strategy"]


class Grid:
    """Every valid candidate, in the space's enumeration order."""

    name = "grid"

    def __call__(self, tuner: Tuner) -> None:
        for params in tuner.ranked_candidates():
            tuner.evaluate(params)


class OOMAwareSearch:
    """The original tuner's search, with its quirks fixed (see the module docstring).

    Args:
        batch: the batch-size symbol (numeric; larger = more memory, faster).
        ratio: the checkpoint-ratio symbol (numeric; smaller = more memory, faster).
        patience: stop after this many evaluations in a row without a better throughput.
    """

    name = "search"

    def __init__(self, batch: str = "batch_size", ratio: str = "ckpt_ratio", patience: int = 5):
        if patience < 1:
            raise TuneError(f"patience {patience!r} must be >= 1", call="OOMAwareSearch")
        self.batch, self.ratio, self.patience = batch, ratio, patience
        self.skipped: List[Params] = []  # candidates proven to OOM (never run)

    def __call__(self, tuner: Tuner) -> None:
        for name in (self.batch, self.ratio):
            sym = tuner.space.symbols.get(name)
            if sym is None or sym.kind == "choice" and not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) for v in sym.values):
                raise TuneError(f"the search needs a numeric symbol {name!r}",
                                call="OOMAwareSearch", hint=f"symbols: {tuner.space.names}; "
                                "choose them with --batch-symbol/--ratio-symbol")
        others = [n for n in tuner.space.names if n not in (self.batch, self.ratio)]
        groups: Dict[Tuple, List[Params]] = {}
        ranked = tuner.ranked_candidates() if tuner.ranks else []
        for params in ranked or tuner.space.candidates():  # planes in their first params' order
            groups.setdefault(tuple(params[n] for n in others), []).append(params)
        planes = [{(p[self.batch], p[self.ratio]): p for p in group} for group in groups.values()]
        self._best: Optional[float] = None
        self._stale, self._seen = 0, set()
        try:
            if ranked:  # the candidate predicted fastest within the budget, first
                self._plane, self._oom = planes[0], []
                self._probe(tuner, ranked[0][self.batch], ranked[0][self.ratio])
            for plane in planes:
                self._search(tuner, plane)
        except _EarlyStop:
            pass

    # one combination of the other symbols -------------------------------------------------
    def _search(self, tuner: Tuner, points: Dict[Tuple[Any, Any], Params]) -> None:
        """Search one (batch x ratio) plane."""
        batches = sorted({b for b, _ in points})
        ratios = sorted({r for _, r in points}, reverse=True)  # from the least memory
        self._plane = points
        self._oom: List[Tuple[Any, Any]] = [  # stored OOMs (earlier sessions) are proofs too
            point for point, params in points.items() if _proves_oom(tuner, params)]
        top = ratios[0]
        column = [b for b in batches if (b, top) in points]
        fits = self._largest(tuner, column, lambda b: (b, top), largest_first=True)
        if fits is None:  # even the smallest batch at the largest ratio does not fit
            return
        for b in reversed([b for b in batches if b <= column[fits]]):
            row = [r for r in ratios if (b, r) in points]
            known = [i for i, r in enumerate(row) if self._fits_known(tuner, b, r)]
            lo = known[-1] if known else -1
            i = self._largest(tuner, row, lambda r, b=b: (b, r), lo=lo)
            if i is not None:  # proven to fit, perhaps not yet run: its throughput counts
                self._probe(tuner, b, row[i])

    def _largest(self, tuner: Tuner, values: Sequence, point, lo: int = -1,
                 largest_first: bool = False) -> Optional[int]:
        """Index of the last value that fits (values ordered by growing memory) by binary
        search; ``lo``: an index known to fit; ``largest_first``: try the last value first (as
        the original does for the batch)."""
        hi = len(values) - 1
        if largest_first and hi > lo:
            status = self._probe(tuner, *point(values[hi]))
            if status == "ok":
                return hi
            hi -= 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._probe(tuner, *point(values[mid])) == "ok":
                lo = mid
            else:
                hi = mid - 1
        return lo if lo >= 0 else None

    def _probe(self, tuner: Tuner, b, r) -> Optional[str]:
        """The status of (b, r): ``oom`` without running it when proven, else evaluated."""
        params = self._plane[(b, r)]
        if tuner.stored(params) is None and any(ob <= b and orr >= r for ob, orr in self._oom):
            if params not in self.skipped:
                self.skipped.append(params)
            return "oom"
        record: Record = tuner.evaluate(params)
        if record.status == "oom" or (record.status == "pruned"
                                      and tuner.trusts_predicted_oom):
            self._oom.append((b, r))
        if record.key not in self._seen and record.status not in ("oom", "pruned"):
            self._seen.add(record.key)  # (stored or run now alike: a resumed search replays)
            improved = record.status == "ok" and (self._best is None
                                                  or record.throughput > self._best)
            self._best = record.throughput if improved else self._best
            self._stale = 0 if improved else self._stale + 1
            if self._stale >= self.patience:
                raise _EarlyStop
        return record.status

    def _fits_known(self, tuner: Tuner, b, r) -> bool:
        """(b, r) is proven to fit: an ok candidate with a batch >= b and a ratio <= r."""
        return any(ob >= b and orr <= r and _status(tuner, params) == "ok"
                   for (ob, orr), params in self._plane.items())


def _status(tuner: Tuner, params: Params) -> Optional[str]:
    record = tuner.stored(params)
    return record.status if record is not None else None


def _proves_oom(tuner: Tuner, params: Params) -> bool:
    """A stored OOM, or a pruned candidate when the policy trusts predicted OOMs."""
    record = tuner.known(params)
    return record is not None and (record.status == "oom" or (
        record.status == "pruned" and tuner.trusts_predicted_oom))


class _EarlyStop(Exception):
    pass


class TPE:
    """Optuna's TPE sampler over the space (see the module docstring)."""

    name = "tpe"

    def __init__(self, seed: int = 0, n_startup_trials: Optional[int] = None,
                 max_repeats: int = 5):
        self.seed, self.n_startup_trials, self.max_repeats = seed, n_startup_trials, max_repeats

    def __call__(self, tuner: Tuner) -> None:
        import optuna

        startup = self.n_startup_trials or max(3, min(10, tuner.budget // 8))
        done = len(tuner.records)  # a resumed study continues with a new, seeded stream
        tuner.study.sampler = optuna.samplers.TPESampler(
            seed=self.seed + done, n_startup_trials=startup, multivariate=True)
        rng = random.Random(self.seed + done)
        valid = tuner.space.candidates()
        if tuner.ranks:  # the startup candidates: the head of the predicted ranking
            self._start_from_ranking(tuner, startup)
        repeats = 0
        for _ in itertools.count():
            todo = [p for p in valid if tuner.known(p) is None]
            if not todo:
                return
            tuner.check_budget()
            if repeats >= self.max_repeats:  # the model keeps proposing known points
                tuner.evaluate(rng.choice(todo))
                repeats = 0
                continue
            tuner_trial = tuner.study.ask()
            params = tuner.suggest(tuner_trial)
            problem = tuner.space.violated(params)
            if problem is not None:
                tuner.tell_unevaluated(tuner_trial, params, "invalid", reason=problem)
                repeats += 1
                continue
            earlier = tuner.known(params)
            if earlier is not None:
                tuner.tell_unevaluated(tuner_trial, params, "duplicate", like=earlier)
                repeats += 1
                continue
            tuner.run_trial(tuner_trial, params)
            repeats = 0

    @staticmethod
    def _start_from_ranking(tuner: Tuner, startup: int) -> None:
        """Run the best-ranked candidates until ``startup`` have been evaluated (this session
        or stored; pruned ones do not count)."""
        for params in tuner.ranked_candidates():
            if sum(r.evaluated for r in tuner.records) >= startup:
                return
            if tuner.known(params) is None:
                tuner.evaluate(params)


STRATEGIES = {"grid": Grid, "search": OOMAwareSearch, "tpe": TPE}


def make_strategy(name: str, **options: Any):
    """A strategy by name (``grid``, ``search``, ``tpe``) with its options."""
    if name not in STRATEGIES:
        raise TuneError(f"unknown strategy {name!r}", call="make_strategy",
                        hint=f"choose one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name](**options)
