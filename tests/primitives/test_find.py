"""find: regex, predicate, dataflow patterns; errors."""

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import slapo
from slapo.trace.pattern import call_module


class Diamond(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.GELU()

    def forward(self, x):
        a = x * 2          # unrelated op between the pattern's ops
        y = self.fc(x)
        z = torch.relu(a)
        return self.act(y + 1) + z


def _traced():
    sch = slapo.create_schedule(nn.Sequential(Diamond()))
    sch["0"].trace(example_inputs=(torch.randn(2, 4),))
    return sch


def test_regex_and_predicate():
    sch = _traced()
    assert [s.nodes[0].target for s in sch.find("fc|act")] == ["fc", "act"]
    found = sch["0"].find(where=lambda n: n.target is operator.add)
    assert len(found) == 2 and all(len(s) == 1 for s in found)


def test_pattern_matches_by_data_edges():
    sch = _traced()
    # functional F.gelu matches the nn.GELU module; `+ 1` must feed it
    found = sch["0"].find(lambda x: F.gelu(call_module("fc", x) + 1))
    assert len(found) == 1
    assert [n.name for n in found[0].nodes] == ["fc", "add", "act"]
    assert found[0].inputs[0].op == "placeholder"
    # same ops, wrong data edge: relu's input is x*2, not fc's output
    with pytest.raises(slapo.PatternError, match="no match"):
        sch["0"].find(lambda x: torch.relu(call_module("fc", x)))


def test_find_errors():
    sch = slapo.create_schedule(nn.Sequential(Diamond()))
    with pytest.raises(slapo.PatternError, match="nothing is traced.*Hint: call"):
        sch.find("fc")
    sch = _traced()
    with pytest.raises(slapo.PatternError, match="no match.*Hint: called modules here: "
                                                 "0.act, 0.fc|no match.*act, fc"):
        sch["0"].find("nope")
    with pytest.raises(slapo.PatternError, match="invalid regex"):
        sch.find("(")
    assert sch.find("nope", allow_empty=True) == []
