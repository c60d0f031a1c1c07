"""A function on N local gloo ranks, for the calibration's measurements that need real
collectives (the gloo all-reduce's latency and bandwidth, a real ZeRO-3 engine): the production
counterpart of the test helper ``slapo.testing.run_distributed``, smaller (no stress options).

:func:`on_local_ranks` spawns ``world_size`` fresh processes (``spawn``: nothing inherited but
the arguments), each in its own session, joined in a gloo group through a file rendezvous in a
private temporary directory, with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set. Each rank writes
its result (or its traceback) to a file; the caller gets the results in rank order, or a
``RuntimeError`` with the first failing rank's traceback, or a ``TimeoutError``. Every rank's
process group is killed on the way out, so nothing is left behind.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, List

__all__ = ["on_local_ranks"]


def _rank(fn: Callable[..., Any], args: tuple, rank: int, world_size: int, tmp: str,
          threads: int) -> None:
    os.setsid()  # a session of its own: the caller kills the rank and its children together
    out = Path(tmp) / f"rank{rank}.pkl"
    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world_size))
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank,
                                world_size=world_size)
        payload = ("ok", fn(*args))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001  (every failure goes to the caller)
        payload = ("error", traceback.format_exc())
    out.with_suffix(".tmp").write_bytes(pickle.dumps(payload))
    os.replace(out.with_suffix(".tmp"), out)
    os._exit(0 if payload[0] == "ok" else 1)


def on_local_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 600.0,
                   threads: int = 1) -> List[Any]:
    """``fn(*args)`` on ``world_size`` local gloo ranks of ``threads`` threads each (``fn``
    defined at module level: it is pickled); the per-rank results (module docstring)."""
    if world_size < 1:
        raise ValueError(f"on_local_ranks: world_size must be >= 1, got {world_size}")
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="slapo-calibration-") as tmp:
        procs = [ctx.Process(target=_rank, args=(fn, args, r, world_size, tmp, threads))
                 for r in range(world_size)]
        try:
            for p in procs:
                p.start()
            return _collect(procs, Path(tmp), time.monotonic() + timeout, timeout)
        finally:
            for p in procs:
                if p.pid is not None and p.is_alive():
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        p.kill()
                p.join(timeout=10)


def _collect(procs, tmp: Path, deadline: float, timeout: float) -> List[Any]:
    """The ranks' results in rank order, once every rank wrote one (or one failed)."""
    results: dict = {}
    while len(results) < len(procs):
        for r, p in enumerate(procs):
            path = tmp / f"rank{r}.pkl"
            if r in results:
                continue
            if path.exists():
                results[r] = pickle.loads(path.read_bytes())
            elif not p.is_alive() and p.exitcode:
                results[r] = ("error", f"exited with code {p.exitcode} without a result")
            if r in results and results[r][0] == "error":
                raise RuntimeError(f"on_local_ranks: rank {r} of {len(procs)} failed:\n"
                                   f"{results[r][1]}")
        if time.monotonic() > deadline:
            missing = sorted(set(range(len(procs))) - set(results))
            raise TimeoutError(f"on_local_ranks: ranks {missing} did not finish within "
                               f"{timeout:.0f} s (all ranks killed)")
        time.sleep(0.02)
    return [results[r][1] for r in range(len(procs))]
