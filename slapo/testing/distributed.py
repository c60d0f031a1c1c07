"""``run_distributed``: run a function on N fresh gloo ranks and collect the results.

Each call spawns ``world_size`` new processes (``spawn`` start method, so no state leaks from the
parent), each in its own process group (session), which join a gloo process group through a file
rendezvous in a private temporary directory. The function's return values come back in rank
order. If a rank raises, its traceback is re-raised in the parent as :class:`RankFailure`; the
other ranks (possibly blocked in a collective) are killed after a short grace period. On timeout
every rank is killed. No process is ever left behind.

``fn`` and its arguments must be picklable: define ``fn`` at module level.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil
import signal
import tempfile
import time
import traceback
from typing import Any, Callable, List, Optional, Sequence

__all__ = ["run_distributed", "RankFailure", "DistributedTimeout"]


class RankFailure(RuntimeError):
    """A rank raised; the message holds that rank's traceback."""

    def __init__(self, rank: int, tb: str):
        self.rank = rank
        self.remote_traceback = tb
        super().__init__(f"rank {rank} failed:\n{tb}")


class DistributedTimeout(TimeoutError):
    """The ranks did not finish in time (all were killed)."""


def _write_result(out_path: str, payload: tuple) -> None:
    try:
        data = pickle.dumps(payload)
    except Exception:  # noqa: BLE001 - unpicklable result
        data = pickle.dumps(("error", "result is not picklable:\n" + traceback.format_exc()))
    with open(out_path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(out_path + ".tmp", out_path)


def _rank_main(fn, args, kwargs, rank, world_size, tmpdir, backend, threads):
    os.setsid()  # own process group, so the parent can kill this rank and its children
    out_path = os.path.join(tmpdir, f"rank{rank}.pkl")
    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world_size))
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        dist.init_process_group(backend, init_method=f"file://{tmpdir}/rendezvous",
                                rank=rank, world_size=world_size)
        result = fn(*args, **kwargs)
    except BaseException:  # noqa: BLE001 - report everything to the parent
        # Report first: tearing down the group would make the other ranks fail too. The time of
        # the failure travels with it: secondary errors may be *read* first (the parent polls
        # the ranks in order), so the parent orders failures by when they happened.
        failed = time.time()
        _write_result(out_path, ("error", traceback.format_exc(), failed))
        os._exit(1)
    dist.destroy_process_group()
    _write_result(out_path, ("ok", result))
    os._exit(0)


def _kill(procs: Sequence[mp.Process]) -> None:
    for p in procs:
        if p.pid is not None and p.is_alive():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()
    for p in procs:
        p.join(timeout=10)


def run_distributed(
    fn: Callable[..., Any],
    world_size: int = 2,
    *args: Any,
    timeout: float = 240.0,
    backend: str = "gloo",
    grace: float = 5.0,
    threads: Optional[int] = None,
    **kwargs: Any,
) -> List[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return the per-rank results.

    Inside ``fn``, ``torch.distributed`` is initialised (``backend``, default gloo) and the usual
    ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` variables are set.

    Raises:
        RankFailure: a rank raised (its traceback is in the message); the rank that failed
            first (by the time of its exception) is reported.
        DistributedTimeout: not all ranks finished within ``timeout`` seconds.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    threads = threads or max(1, (os.cpu_count() or 1) // world_size)
    ctx = mp.get_context("spawn")
    tmpdir = tempfile.mkdtemp(prefix="slapo-dist-")
    procs = [
        ctx.Process(target=_rank_main, daemon=False,
                    args=(fn, args, kwargs, r, world_size, tmpdir, backend, threads))
        for r in range(world_size)
    ]
    try:
        for p in procs:
            p.start()
        results: dict = {}
        deadline = time.monotonic() + timeout
        failed_at: Optional[float] = None
        order: List[int] = []  # ranks in the order their results arrived
        while len(results) < world_size:
            for r in range(world_size):
                path = os.path.join(tmpdir, f"rank{r}.pkl")
                if r not in results and os.path.exists(path):
                    with open(path, "rb") as f:
                        results[r] = pickle.load(f)
                    order.append(r)
                    if results[r][0] == "error" and failed_at is None:
                        failed_at = time.monotonic()
                elif r not in results and not procs[r].is_alive() and procs[r].exitcode:
                    results[r] = ("error", f"process exited with code {procs[r].exitcode} "
                                           "without reporting (killed? out of memory?)")
                    order.append(r)
                    failed_at = failed_at or time.monotonic()
            now = time.monotonic()
            if failed_at is not None and now - failed_at > grace:
                break
            if now > deadline:
                _kill(procs)
                missing = sorted(set(range(world_size)) - set(results))
                raise DistributedTimeout(
                    f"ranks {missing} did not finish within {timeout:.0f}s (all ranks killed)"
                )
            time.sleep(0.02)
        errors = [(r, results[r][1]) for r in order if results[r][0] == "error"]
        # earliest failure first (ranks that died without reporting: when they were noticed)
        when = {r: results[r][2] if len(results[r]) > 2 else float("inf") for r, _ in errors}
        errors.sort(key=lambda e: when[e[0]])
        if errors:
            rank, tb = errors[0]  # the first rank to fail is usually the cause
            others = [r for r, _ in errors[1:]] + sorted(set(range(world_size)) - set(results))
            if others:
                tb += f"\n(ranks {others} also failed or were killed afterwards)"
            raise RankFailure(rank, tb)
        return [results[r][1] for r in range(world_size)]
    finally:
        _kill(procs)
        shutil.rmtree(tmpdir, ignore_errors=True)
