"""``slapo.VerifyOptions``: the same call as keyword arguments; wrong keywords fail at the call."""

import dataclasses

import pytest
import torch
from torch import nn

import slapo
import slapo.verification
from slapo.testing import MLP

EXACT = slapo.VerifyOptions(dtype=torch.float64, steps=2, raise_on_mismatch=False)


def _wrong_schedule():
    """An MLP whose GeLU became a ReLU: every comparison has something to report."""
    torch.manual_seed(0)
    sch = slapo.create_schedule(MLP(), keep_original=True)
    sch["act"].replace(nn.ReLU())
    return sch


def _inputs():
    return (torch.randn(4, 16, generator=torch.Generator().manual_seed(1)),)


def test_options_object_is_the_same_call_as_keywords():
    assert slapo.VerifyOptions is slapo.verification.VerifyOptions
    by_keywords = slapo.verify(_wrong_schedule(), _inputs(), dtype=torch.float64, steps=2,
                               raise_on_mismatch=False)
    assert not by_keywords.ok and by_keywords.params_after_step and by_keywords.grads
    assert by_keywords.first_divergence[0] == "act"
    assert slapo.verify(_wrong_schedule(), _inputs(), options=EXACT) == by_keywords
    # a keyword agreeing with the options is allowed
    assert slapo.verify(_wrong_schedule(), _inputs(), options=EXACT, steps=2) == by_keywords
    derived = dataclasses.replace(EXACT, steps=1)
    once = slapo.verify(_wrong_schedule(), _inputs(), options=derived)
    assert not once.ok and not once.params_after_step
    with pytest.raises(slapo.VerifyError, match="first divergence at 'act'"):
        slapo.verify(_wrong_schedule(), _inputs(), options=slapo.VerifyOptions())


def test_the_block_takes_options_too():
    reports = []
    for kwargs in ({"options": EXACT}, dataclasses.asdict(EXACT)):
        torch.manual_seed(0)
        sch = slapo.create_schedule(MLP())
        with slapo.Verify(sch, _inputs(), **kwargs) as v:
            sch["act"].replace(nn.ReLU())
        reports.append(v.report)
    assert not reports[0].ok and reports[0] == reports[1]


def test_defaults_are_those_of_verify():
    opts = slapo.VerifyOptions()
    assert dataclasses.asdict(opts) == {
        "check_grads": True, "dtype": None, "rtol": None, "atol": None, "steps": 1, "lr": 0.1,
        "eval_mode": True, "seed": 2023, "localize": True, "rules": True, "load_weights": True,
        "init_weights": True, "init_seed": 0, "device": None, "check_memory": True,
        "raise_on_mismatch": True}
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.steps = 3


def test_unknown_and_conflicting_keywords_fail_at_the_call():
    sch, inputs = _wrong_schedule(), _inputs()
    with pytest.raises(slapo.VerifyError, match=r"unknown argument\(s\) devcie.*device=\?"):
        slapo.verify(sch, inputs, devcie="cpu")
    with pytest.raises(slapo.VerifyError, match=r"unknown argument\(s\) zzz.*Hint: the keyword "
                       r"arguments of verify: inputs, reference, check_grads, .*options"):
        slapo.verify(sch, inputs, zzz=1)
    with pytest.raises(slapo.VerifyError, match=r"keyword argument\(s\) steps=3 contradict "
                       r"options= \(options.steps=2\).*Hint: .*dataclasses.replace\(options, "
                       r"steps=\.\.\.\)"):
        slapo.verify(sch, inputs, options=EXACT, steps=3)
    with pytest.raises(slapo.VerifyError, match=r"options must be a slapo.VerifyOptions"):
        slapo.verify(sch, inputs, options={"steps": 2})
    with pytest.raises(slapo.VerifyError, match=r"dtype=torch.float32 contradict options="):
        slapo.Verify(sch, inputs, options=EXACT, dtype=torch.float32)  # before the block
    with pytest.raises(slapo.VerifyError, match=r"unknown argument\(s\) optoins.*options=\?"):
        slapo.Verify(sch, inputs, optoins=EXACT)
    with pytest.raises(slapo.VerifyError, match=r"device='meta', but the scheduled"):
        slapo.Verify(sch, inputs, options=slapo.VerifyOptions(device="meta"))
