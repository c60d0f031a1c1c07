"""end2end.simulate.calibration.local_ranks: a function on local gloo ranks for the calibration
(results in rank order, a failing rank's traceback, a timeout, nothing left behind)."""

import time

import pytest

from end2end.simulate.calibration.local_ranks import on_local_ranks


def _sum_of_ranks(offset):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return (dist.get_rank(), dist.get_world_size(), t.item() + offset, torch.get_num_threads())


def _fails_on_rank_one():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("rank one says no")
    return 0


def _sleeps():
    time.sleep(60)


def test_results_come_back_in_rank_order():
    assert on_local_ranks(_sum_of_ranks, 2, 10.0, timeout=120) == [(0, 2, 11.0, 1),
                                                                   (1, 2, 11.0, 1)]


def test_a_failing_rank_and_a_timeout_are_errors():
    with pytest.raises(RuntimeError, match="rank 1 of 2 failed:(.|\n)*rank one says no"):
        on_local_ranks(_fails_on_rank_one, 2, timeout=120)
    began = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks \[0\] did not finish within 3 s"):
        on_local_ranks(_sleeps, 1, timeout=3)
    assert time.monotonic() - began < 40
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        on_local_ranks(_sleeps, 0)
