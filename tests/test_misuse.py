"""Every schedule misuse raises a SlapoError subclass whose message names the module path (or
the call) and gives a hint (the table in docs/errors.md is rendered from the same cases)."""

import re

import pytest

from slapo.testing import run_distributed
from tests.misuse_cases import CASES, TP_CASES, run_case, run_tp_cases

_WHERE = re.compile(r"'[^']*'|on '<root>'|\w+\(")


def _assert_good_error(kind, message, is_slapo, description):
    assert kind, f"{description}: nothing was raised"
    assert is_slapo, f"{description}: raised {kind}, not a SlapoError: {message}"
    assert "Hint: " in message, f"{description}: no hint in: {message}"
    assert _WHERE.search(message.split("Hint:")[0]), f"{description}: no path/call in {message}"


@pytest.mark.parametrize("primitive,description,fn", CASES, ids=[c[1] for c in CASES])
def test_single_process_misuse(primitive, description, fn):
    _assert_good_error(*run_case(fn), description)


def test_two_rank_misuse():
    results = run_distributed(run_tp_cases, 2)
    for rank_results in results:
        for (_primitive, description, _), result in zip(TP_CASES, rank_results):
            _assert_good_error(*result, description)


def test_enough_distinct_cases():
    assert len({c[1] for c in CASES + TP_CASES}) >= 25
