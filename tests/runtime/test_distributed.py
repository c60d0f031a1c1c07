"""``slapo.runtime.distributed``: one place for process groups, device, timeouts and teardown."""

import os
import time

import pytest
import torch
import torch.distributed as dist

from slapo.runtime import distributed as sd
from slapo.testing import RankFailure, run_distributed


def test_single_process_world_and_teardown(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert not dist.is_initialized()
    calls = []
    try:
        env = sd.init_distributed()
        assert (env.rank, env.world_size, env.backend) == (0, 1, "gloo" if
                                                          env.device.type == "cpu" else "nccl")
        assert sd.init_distributed() == env  # reused
        sd.register_teardown(lambda: calls.append(dist.is_initialized()))
    finally:
        sd.teardown()
    assert calls == [True]  # registered clean-ups run before the group goes
    assert not dist.is_initialized()
    sd.teardown()  # idempotent


def test_device_and_backend():
    assert sd.pick_device().type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert sd.backend_for(torch.device("cpu")) == "gloo"
    assert sd.backend_for(torch.device("cuda", 0)) == "nccl"


def _stuck_peer():
    from slapo.dialects.common import data_parallel_group

    os.environ["SLAPO_DIST_TIMEOUT"] = "2"
    groups = [dist.new_group([r]) for r in range(dist.get_world_size())]
    dp = data_parallel_group(groups[dist.get_rank()])  # created with the 2 s timeout
    if dist.get_rank() == 1:
        time.sleep(60)  # alive but never joins the collective
    dist.all_reduce(torch.ones(1), group=dp)


def test_a_stuck_rank_fails_the_job_within_the_timeout():
    start = time.monotonic()
    with pytest.raises(RankFailure, match="(?s)rank 0 failed.*Timed out"):
        run_distributed(_stuck_peer, 2, timeout=120)
    assert time.monotonic() - start < 45
