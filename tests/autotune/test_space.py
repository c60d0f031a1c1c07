"""Search spaces: values, derived values, constraints, and clear errors for bad declarations."""

import pytest

from slapo.autotune import Space
from slapo.errors import SlapoError, TuneError


def test_symbols_derived_values_and_constraints():
    s = Space("polygon")
    s.int("batch_size", 4, 16, step=4)
    s.float("ckpt_ratio", 0.0, 1.0, step=0.25)
    s.choice("tp", [1, 2])
    s.derive("dp", lambda c: 2 // c["tp"])
    s.constrain(lambda c: c["batch_size"] % (2 * c["dp"]) == 0, "batch divisible by 2 dp")
    s.constrain(lambda c: c["batch_size"] <= 8 or c["ckpt_ratio"] >= 0.5, "large batch: ckpt")
    assert s.symbols["batch_size"].values == (4, 8, 12, 16)
    assert s.symbols["ckpt_ratio"].values == (0.0, 0.25, 0.5, 0.75, 1.0)
    cands = s.candidates()
    expected = [dict(batch_size=b, ckpt_ratio=r, tp=t) for b in (4, 8, 12, 16)
                for r in (0.0, 0.25, 0.5, 0.75, 1.0) for t in (1, 2)
                if b % (2 * (2 // t)) == 0 and (b <= 8 or r >= 0.5)]
    assert cands == expected and s.size() == 40
    assert s.complete(dict(batch_size=8, ckpt_ratio=0.5, tp=2))["dp"] == 1
    assert s.violated(dict(batch_size=12, ckpt_ratio=0.0, tp=2)) == "large batch: ckpt"
    assert s.violated(dict(batch_size=5, ckpt_ratio=0.0, tp=2)).startswith("batch_size=5 is")
    assert s.violated(dict(batch_size=8, ckpt_ratio=0.0, tp=2)) is None


@pytest.mark.parametrize("declare, match", [
    (lambda s: s.int("b", 8, 4), "low 8 is greater than high 4"),
    (lambda s: s.int("b", 4, 8, step=0), "step 0 is not positive"),
    (lambda s: s.int("b", 4, 10, step=4), "not a multiple of the step 4.*high = 8"),
    (lambda s: s.int("b", 4.5, 8), "low=4.5 is not an integer"),
    (lambda s: s.float("r", 0.0, 1.0, step=0.3), "not a multiple of the step 0.3"),
    (lambda s: s.float("r", 0.0, float("nan"), step=0.5), "high=nan is not a finite number"),
    (lambda s: s.choice("m", []), "has no values"),
    (lambda s: s.choice("m", ["a", "b", "a"]), "repeats the value"),
    (lambda s: s.choice("m", [[1, 2]]), "is a list"),
    (lambda s: s.int("batch size", 1, 2), "not a Python identifier"),
    (lambda s: (s.int("b", 1, 2), s.choice("b", [1])), "declared twice"),
    (lambda s: s.constrain("b > 2", ""), "expected a callable and a description"),
])
def test_bad_declarations_are_clear_errors(declare, match):
    with pytest.raises(TuneError, match=match) as info:
        declare(Space("bad"))
    assert isinstance(info.value, SlapoError) and "Space 'bad'" in str(info.value)


def test_unsatisfiable_constraints_name_what_each_rejects():
    s = Space("empty")
    s.int("batch_size", 1, 3)
    s.constrain(lambda c: c["batch_size"] > 1, "more than one")
    s.constrain(lambda c: c["batch_size"] > 5, "more than five")
    with pytest.raises(TuneError, match=r"no candidate satisfies every constraint \('more than "
                       r"one' rejects 1 of 3; 'more than five' rejects 3 of 3\).*Hint: widen"):
        s.candidates()


def test_rules_reading_unknown_names_or_raising_are_named():
    s = Space("typo")
    s.int("batch_size", 1, 2)
    s.constrain(lambda c: c["batchsize"] > 0, "positive")
    with pytest.raises(TuneError, match="constraint 'positive' reads 'batchsize', which is not "
                       "a symbol.*known: batch_size"):
        s.candidates()
    s = Space("raises")
    s.int("batch_size", 0, 2)
    s.derive("per_rank", lambda c: 4 // c["batch_size"])
    with pytest.raises(TuneError, match="derived value 'per_rank' raised ZeroDivisionError"):
        s.candidates()
    with pytest.raises(TuneError, match="has no symbols"):
        Space("none").candidates()
    big = Space("big")
    for name in "abcdef":
        big.int(name, 1, 10)
    with pytest.raises(TuneError, match="1000000 candidates, more than"):
        big.candidates()
