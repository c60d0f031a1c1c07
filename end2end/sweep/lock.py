"""One sweep per results file: an advisory lock held for the sweep's whole lifetime.

Two sweeps of one config on one results file would each see the same runs as pending and run
every line twice (issue 19). :class:`SweepLock` takes an exclusive ``fcntl.flock`` on
``<results>.lock`` (not on the results file itself: the driver processes append rows under
their own short lock on that file). The lock file holds the owner's pid and start time, for the
message a second sweep prints. The kernel drops the lock when the process dies, however it
dies, so a stale lock file never blocks anything.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Optional, Union

from slapo.errors import ConfigError

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
                 on_wait: Optional[callable] = None):
        self.results = Path(results)
        self.path = lock_path(results)
        self.wait = wait
        self.on_wait = on_wait  # called once with the owner text when --wait has to wait
        self._fh = None

    def _owner(self) -> str:
        try:
            text = self.path.read_text().strip()
        except OSError:
            return "another sweep"
        return text or "another sweep"

    def acquire(self) -> "SweepLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = self._owner()
            if not self.wait:
                fh.close()
                raise SweepBusyError(
                    f"{self.results} is in use by {owner}",
                    hint="wait for it to finish, pass --wait to queue behind it, or write to "
                         "another --results file") from None
            if self.on_wait:
                self.on_wait(owner)
            fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        fh.truncate()
        fh.write(f"sweep pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None

    def __enter__(self) -> "SweepLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
