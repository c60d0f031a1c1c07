import os
import time

import pytest
import torch
import torch.distributed as dist

from slapo.testing import DistributedTimeout, RankFailure, run_distributed


def _all_reduce(value):
    t = torch.tensor([float(value + dist.get_rank())])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), os.environ["LOCAL_RANK"], t.item(), os.getpid()


def _write_pid(pid_dir):
    """This rank's pid file, written whole (a reader never sees it empty)."""
    path = os.path.join(pid_dir, f"{dist.get_rank()}.pid")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


def _fail_on_rank_one(pid_dir):
    _write_pid(pid_dir)
    if dist.get_rank() == 1:
        # fail only once rank 0 has written its pid: on a loaded machine rank 0 could otherwise
        # be stopped before it did, and the test could not check that it is gone
        while not os.path.exists(os.path.join(pid_dir, "0.pid")):
            time.sleep(0.01)
        raise ValueError("boom on rank one")
    dist.barrier()  # rank 0 hangs here: rank 1 never arrives
    return "unreachable"


def _sleep(pid_dir):
    _write_pid(pid_dir)
    time.sleep(600)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids(pid_dir):
    return [int(open(os.path.join(pid_dir, f)).read()) for f in os.listdir(pid_dir)
            if f.endswith(".pid")]


def test_two_ranks_all_reduce():
    results = run_distributed(_all_reduce, 2, 10)
    assert [r[:4] for r in results] == [(0, 2, "0", 21.0), (1, 2, "1", 21.0)]
    assert not any(_alive(r[4]) for r in results)


def test_failing_rank_reports_traceback_and_leaves_nothing(tmp_path):
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_distributed(_fail_on_rank_one, 2, str(tmp_path), grace=2.0)
    assert info.value.rank == 1
    assert "ValueError: boom on rank one" in str(info.value)
    assert "_fail_on_rank_one" in str(info.value)
    assert time.monotonic() - start < 60
    pids = _pids(tmp_path)
    assert len(pids) == 2 and not any(_alive(p) for p in pids)


def test_timeout_kills_every_rank(tmp_path):
    with pytest.raises(DistributedTimeout, match=r"ranks \[0, 1\] did not finish"):
        run_distributed(_sleep, 2, str(tmp_path), timeout=60)
    pids = _pids(tmp_path)
    assert len(pids) == 2 and not any(_alive(p) for p in pids)
