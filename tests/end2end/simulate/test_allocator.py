"""The caching allocator's configuration in the fits verdict: with expandable segments no
fragmentation is added to the peak (end2end/simulate/cost/allocator.py), the planner's cluster
judges alike, and the validation set simulates each published run with its launcher's
configuration."""

import os

import pytest

from end2end.plan.cluster import parse_cluster
from end2end.simulate.cost.allocator import (ENV, allocator_mode, configured, expandable_segments,
                                             needed_bytes)
from end2end.simulate.cost.profiles import PROFILES
from end2end.simulate.validate import load_points

A100 = PROFILES["a100-80gb"]


@pytest.mark.parametrize("conf, on", [("", False), ("expandable_segments:True", True),
                                      ("max_split_size_mb:64,expandable_segments:True", True),
                                      ("expandable_segments:False", False),
                                      ("garbage_collection_threshold:0.6", False)])
def test_the_configuration_is_parsed_as_pytorch_writes_it(conf, on):
    assert expandable_segments(conf) is on
    assert allocator_mode(conf) == ("expandable" if on else "default")


def test_expandable_segments_add_no_fragmentation_to_the_need():
    peak = 75 * 2 ** 30
    default = needed_bytes(peak, A100, "")
    expandable = needed_bytes(peak, A100, "expandable_segments:True")
    assert default == pytest.approx(peak * (1 + A100.allocator_overhead) + A100.reserved_bytes)
    assert expandable == pytest.approx(peak + A100.reserved_bytes)
    assert expandable < A100.memory_bytes < default  # the verdict turns on it


def test_configured_sets_and_restores_the_environment(monkeypatch):
    monkeypatch.setenv(ENV, "max_split_size_mb:64")
    with configured("expandable_segments:True"):
        assert expandable_segments()
        assert parse_cluster("a100-80gb").allocator_overhead == 0.0
    assert os.environ[ENV] == "max_split_size_mb:64"
    assert parse_cluster("a100-80gb").allocator_overhead == A100.allocator_overhead
    with configured(""):
        assert ENV not in os.environ
    assert os.environ[ENV] == "max_split_size_mb:64"


def test_torchtitans_points_run_with_its_launchers_configuration():
    confs = {p.id: p.info["alloc_conf"] for p in load_points()}
    assert all(confs[i] == "expandable_segments:True" for i in confs if i.startswith("tt-"))
    assert not any(confs[i] for i in confs if not i.startswith("tt-"))
