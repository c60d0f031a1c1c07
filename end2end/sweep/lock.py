"""One sweep per results file: a lock held for the sweep's whole lifetime.

Two sweeps of one config on one results file would each see the same runs as pending and run
every line twice (issue 19). :class:`SweepLock` holds ``<results>.lock`` (not the results file
itself, nor ``<results>.append.lock``, under which the driver processes append their rows:
:mod:`end2end.results.locked_file`) through
:class:`slapo.runtime.owner_lock.OwnerLock` (filelock, i.e. the kernel's ``flock``; what it does
on Unix is written there). The lock file says ``sweep pid N since ...``, for the message a
second sweep prints. The kernel drops the lock when the process dies, however it dies, so a
stale lock file never blocks anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Union

from slapo.errors import ConfigError
from slapo.runtime.owner_lock import OwnerLock, OwnerLockBusy

__all__ = ["SweepLock", "SweepBusyError", "lock_path"]


class SweepBusyError(ConfigError):
    """Another sweep holds the results file."""


def lock_path(results: Union[str, Path]) -> Path:
    """``results/cpu.tsv`` -> ``results/cpu.tsv.lock``."""
    results = Path(results)
    return results.with_name(results.name + ".lock")


class SweepLock:
    """``with SweepLock("r.tsv", wait=False): ...`` — refuse (``SweepBusyError``) or, with
    ``wait``, block until the other sweep on the same results file ends."""

    def __init__(self, results: Union[str, Path], wait: bool = False,
                 on_wait: Optional[Callable[[str], None]] = None):
        self.results = Path(results)
        self.path = lock_path(results)
        self.wait = wait
        self.on_wait = on_wait  # called once with the owner text when --wait has to wait
        self._lock = OwnerLock(self.path, owner="sweep")

    def acquire(self) -> "SweepLock":
        try:
            self._lock.acquire(wait=self.wait, on_wait=self.on_wait)
        except OwnerLockBusy as exc:
            raise SweepBusyError(
                f"{self.results} is in use by {exc.owner}",
                hint="wait for it to finish, pass --wait to queue behind it, or write to "
                     "another --results file") from None
        return self

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> "SweepLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
