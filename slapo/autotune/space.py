"""Search spaces declared in Python: symbols, derived values and constraints.

A tuning space is a finite set of *candidates*. Each candidate gives every *symbol* one of its
values; *derived* values are computed from them (e.g. the data-parallel size from the TP degree);
*constraints* drop candidates (e.g. a batch that the data-parallel size does not divide). The
space is finite on purpose: every strategy (grid, the OOM-aware search, TPE) works on the same
discrete set, so their results compare point for point, and a grid can be the ground truth::

    from slapo.autotune import Space

    space = Space()
    space.int("batch_size", 4, 32, step=4)
    space.float("ckpt_ratio", 0.0, 1.0, step=0.25)
    space.choice("tp", [1, 2])
    space.derive("dp", lambda c: 2 // c["tp"])
    space.constrain(lambda c: c["batch_size"] % c["dp"] == 0, "batch divisible by dp")

This replaces the original tuner's ``Symbol``/``Space`` objects, whose comparison operators
returned False while a symbol was unfixed so that ``if`` statements could shape a polygonal
space: here the polygon is an explicit, named constraint, and a mistake (an empty range, a
constraint that rejects everything, a name a constraint does not know) is a :class:`TuneError`
saying what is wrong and how to fix it, raised when the space is declared or first enumerated.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import TuneError

__all__ = ["Space", "Symbol", "Params", "MAX_CANDIDATES"]

Params = Dict[str, Any]
MAX_CANDIDATES = 100_000  # every strategy enumerates the space; tuning runs are seconds each


@dataclass(frozen=True)
class Symbol:
    """A tunable name and its ordered values. ``kind``: ``int``/``float`` (an arithmetic range:
    ordered, Optuna's TPE models it as a number) or ``choice`` (categorical)."""

    name: str
    values: Tuple[Any, ...]
    kind: str
    low: Optional[float] = None
    high: Optional[float] = None
    step: Optional[float] = None


@dataclass(frozen=True)
class _Rule:
    name: str
    fn: Callable[[Mapping[str, Any]], Any]


class Space:
    """A finite search space (see the module docstring).

    Symbols are enumerated in declaration order (the first varies slowest), derived values are
    computed in declaration order (each sees the symbols and earlier derived values), then every
    constraint must hold.
    """

    def __init__(self, name: str = "space"):
        self.name = name
        self.symbols: Dict[str, Symbol] = {}
        self.derived: List[_Rule] = []
        self.constraints: List[_Rule] = []
        self._candidates: Optional[List[Params]] = None

    # -- declaration ------------------------------------------------------------------------
    def int(self, name: str, low: int, high: int, step: int = 1) -> Symbol:
        """Integers ``low, low+step, ..., high`` (``high - low`` must be a multiple of ``step``)."""
        for what, v in (("low", low), ("high", high), ("step", step)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise self._error(name, f"{what}={v!r} is not an integer",
                                  "use space.float() or space.choice() for other values")
        self._check_range(name, low, high, step)
        return self._add(Symbol(name, tuple(range(low, high + 1, step)), "int", low, high, step))

    def float(self, name: str, low: float, high: float, step: float) -> Symbol:
        """Numbers ``low, low+step, ..., high`` (a discrete grid: tuning runs are expensive)."""
        for what, v in (("low", low), ("high", high), ("step", step)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise self._error(name, f"{what}={v!r} is not a finite number")
        self._check_range(name, low, high, step)
        n = round((high - low) / step)
        values = tuple(round(low + i * step, 12) for i in range(n + 1))
        return self._add(Symbol(name, values, "float", float(low), float(high), float(step)))

    def choice(self, name: str, values: Sequence[Any]) -> Symbol:
        """One of ``values`` (numbers, strings, bools or None), in the given order."""
        values = tuple(values) if not isinstance(values, (str, bytes)) else (values,)
        if not values:
            raise self._error(name, "has no values", "give at least one value")
        for v in values:
            if v is not None and not isinstance(v, (bool, int, float, str)):
                raise self._error(name, f"value {v!r} is a {type(v).__name__}",
                                  "values must be numbers, strings, bools or None (they are "
                                  "stored in the study database and put on command lines)")
        if len(set(values)) != len(values):
            dup = sorted({repr(v) for v in values if values.count(v) > 1})
            raise self._error(name, f"repeats the value(s) {', '.join(dup)}",
                              "list each value once")
        return self._add(Symbol(name, values, "choice"))

    def derive(self, name: str, fn: Callable[[Mapping[str, Any]], Any]) -> None:
        """A value computed from each candidate (usable by constraints and command templates)."""
        self._check_name(name)
        self.derived.append(_Rule(name, fn))
        self._candidates = None

    def constrain(self, fn: Callable[[Mapping[str, Any]], Any], description: str) -> None:
        """Keep only candidates for which ``fn(values)`` is true; ``description`` names the rule
        in errors (e.g. ``"batch divisible by dp"``)."""
        if not callable(fn) or not isinstance(description, str) or not description:
            raise TuneError(f"constrain({fn!r}, {description!r}): expected a callable and a "
                            "description", call=f"Space {self.name!r}",
                            hint="space.constrain(lambda c: c['batch_size'] % 2 == 0, "
                            "'even batch')")
        self.constraints.append(_Rule(description, fn))
        self._candidates = None

    # -- queries ----------------------------------------------------------------------------
    @property
    def names(self) -> List[str]:
        """Symbol names in declaration order."""
        return list(self.symbols)

    def complete(self, params: Mapping[str, Any]) -> Params:
        """``params`` (one value per symbol) plus the derived values."""
        missing = [n for n in self.symbols if n not in params]
        extra = [n for n in params if n not in self.symbols]
        if missing or extra:
            raise TuneError(f"parameters {dict(params)} do not match the symbols {self.names}"
                            f" (missing {missing}, unknown {extra})", call=f"Space {self.name!r}")
        values: Params = {n: params[n] for n in self.symbols}
        for rule in self.derived:
            values[rule.name] = self._call(rule, values, "derived value")
        return values

    def violated(self, params: Mapping[str, Any]) -> Optional[str]:
        """The description of the first constraint ``params`` violates, or None if it is valid
        (also when a value lies outside its symbol's values)."""
        for name, sym in self.symbols.items():
            if params.get(name) not in sym.values:
                return f"{name}={params.get(name)!r} is not one of {list(sym.values)}"
        values = self.complete(params)
        for rule in self.constraints:
            if not self._call(rule, values, "constraint"):
                return rule.name
        return None

    def candidates(self) -> List[Params]:
        """Every valid candidate (symbols only), symbols varying in declaration order; raises
        :class:`TuneError` if there is none (naming what each constraint rejects)."""
        if self._candidates is None:
            self._candidates = self._enumerate()
        return [dict(c) for c in self._candidates]

    def size(self) -> int:
        """The number of symbol combinations before constraints."""
        return math.prod(len(s.values) for s in self.symbols.values())

    def describe(self) -> str:
        """A one-line, stable description (stored in the study to detect a changed space)."""
        parts = [f"{s.name}={list(s.values)}" for s in self.symbols.values()]
        parts += [f"derive {r.name}" for r in self.derived]
        parts += [f"constraint {r.name!r}" for r in self.constraints]
        return "; ".join(parts)

    # -- internals --------------------------------------------------------------------------
    def _enumerate(self) -> List[Params]:
        if not self.symbols:
            raise TuneError("has no symbols", call=f"Space {self.name!r}",
                            hint="declare some with space.int(), space.float(), space.choice()")
        if self.size() > MAX_CANDIDATES:
            raise TuneError(f"has {self.size()} candidates, more than {MAX_CANDIDATES}",
                            call=f"Space {self.name!r}",
                            hint="coarsen the steps or fix some symbols; every candidate is "
                            "a training run")
        valid, rejected = [], {r.name: 0 for r in self.constraints}
        for combo in itertools.product(*(s.values for s in self.symbols.values())):
            params = dict(zip(self.symbols, combo))
            values = self.complete(params)
            failed = [r.name for r in self.constraints
                      if not self._call(r, values, "constraint")]
            for name in failed:
                rejected[name] += 1
            if not failed:
                valid.append(params)
        if not valid:
            detail = "; ".join(f"{name!r} rejects {n} of {self.size()}"
                               for name, n in rejected.items())
            raise TuneError(f"no candidate satisfies every constraint ({detail})",
                            call=f"Space {self.name!r}",
                            hint="widen the symbols' ranges or relax a constraint")
        return valid

    def _call(self, rule: _Rule, values: Params, what: str) -> Any:
        try:
            return rule.fn(values)
        except KeyError as exc:
            known = ", ".join(values)
            raise TuneError(f"{what} {rule.name!r} reads {exc}, which is not a symbol or an "
                            f"earlier derived value (known: {known})", call=f"Space {self.name!r}",
                            hint="declare it before the rule that uses it") from None
        except Exception as exc:  # a user function: name it and the candidate
            raise TuneError(f"{what} {rule.name!r} raised {type(exc).__name__}: {exc} on "
                            f"{values}", call=f"Space {self.name!r}") from exc

    def _check_range(self, name: str, low, high, step) -> None:
        if step <= 0:
            raise self._error(name, f"step {step!r} is not positive", "use a step > 0")
        if low > high:
            raise self._error(name, f"low {low!r} is greater than high {high!r}",
                              "swap them")
        n = (high - low) / step
        if abs(n - round(n)) > 1e-9 * max(1.0, abs(n)):
            raise self._error(name, f"high - low = {high - low!r} is not a multiple of the "
                              f"step {step!r}", f"use high = {low + math.floor(n) * step!r} "
                              "or another step")

    def _check_name(self, name: str) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise TuneError(f"name {name!r} is not a Python identifier",
                            call=f"Space {self.name!r}",
                            hint="names appear as {name} placeholders in commands: use letters, "
                            "digits and underscores")
        if name in self.symbols or name in {r.name for r in self.derived}:
            raise TuneError(f"name {name!r} is declared twice", call=f"Space {self.name!r}",
                            hint="give every symbol and derived value its own name")

    def _add(self, symbol: Symbol) -> Symbol:
        self._check_name(symbol.name)
        self.symbols[symbol.name] = symbol
        self._candidates = None
        return symbol

    def _error(self, name: str, what: str, hint: Optional[str] = None) -> TuneError:
        return TuneError(f"symbol {name!r} {what}", call=f"Space {self.name!r}", hint=hint)
