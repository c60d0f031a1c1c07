"""One owner at a time: an exclusive lock on a file, held for a whole command's lifetime.

Used where two copies of a command on the same file would silently duplicate work: one sweep
per results file (``end2end.sweep.lock``), one tuner per study database
(:mod:`slapo.autotune.study`)::

    lock = OwnerLock("r.tsv.lock", owner="sweep")
    lock.acquire()               # OwnerLockBusy("r.tsv.lock is in use by sweep pid 12 since ...")
    lock.acquire(wait=True, on_wait=print)  # or queue behind the holder
    ...
    lock.release()               # or ``with OwnerLock(...):``

The holder writes ``<owner> pid N since YYYY-MM-DD HH:MM:SS`` into the lock file, so the
process that is refused can say who holds it. The lock is the kernel's (``flock``), taken
through the `filelock <https://py-filelock.readthedocs.io>`_ library: when the holder dies,
however it dies, the kernel drops the lock, so a leftover lock file never blocks anything.

What filelock 4.3.1 does on Unix (read in its ``_native/_unix.py`` and ``_core``, and checked):

* ``FileLock`` is ``UnixFileLock``: ``fcntl.flock(LOCK_EX | LOCK_NB)`` on a descriptor opened
  ``O_RDWR | O_CREAT`` (no ``O_TRUNC``), polled every ``poll_interval`` while waiting. It
  neither truncates nor deletes the lock file: the file stays on release "so waiters share the
  same inode", and what the last holder wrote stays in it. The descriptor is not inherited by
  child processes (``O_CLOEXEC``), and a forked child closes its copy without unlocking, so the
  training processes a sweep starts never keep its lock alive.
* Across processes it excludes as ``flock`` does; a killed holder's lock is gone at once.
* Within one process, two ``FileLock`` objects on one path open two descriptors, so they
  exclude each other like two processes (threads included). Two filelock rules matter here:
  a ``thread_local=True`` lock (the default) can only be released by the thread that took it,
  and an *unbounded* wait (``timeout=-1``) in a thread that already holds another instance on
  the same path raises ``RuntimeError("Deadlock ...")``. So this module uses
  ``thread_local=False`` and waits in bounded slices.
* Dropping the last reference to a held ``FileLock`` releases it (its ``__del__``): the
  ``OwnerLock`` keeps its ``FileLock`` for as long as it holds the lock.
* On a filesystem without ``flock`` filelock would fall back to a "soft" lock (the file's
  existence, with its own owner record in it). Passing ``on_acquired`` (how the owner text is
  written) turns that fallback off: such a filesystem is an ``OSError`` here, not a lock that
  a crashed holder leaves behind.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Optional, Union

from filelock import FileLock, Timeout

from ..errors import SlapoError

__all__ = ["OwnerLock", "OwnerLockBusy"]

#: While waiting, the lock is retried every POLL seconds, in slices of WAIT_SLICE seconds.
POLL = 0.1
WAIT_SLICE = 60.0


class OwnerLockBusy(SlapoError):
    """Another process (or another ``OwnerLock`` in this one) holds the lock; ``.owner`` says
    which, as the holder wrote it."""

    def __init__(self, path: Path, owner: str):
        super().__init__(f"{path} is in use by {owner}",
                         hint="wait for it to finish, or use another file")
        self.path, self.owner = path, owner


class OwnerLock:
    """An exclusive, non-reentrant lock on ``path`` for one owner (``owner`` names it in the
    text other processes see: ``"sweep"`` -> ``sweep pid 12 since 2024-05-01 10:00:00``)."""

    def __init__(self, path: Union[str, Path], owner: str = "process"):
        self.path = Path(path)
        self.owner = owner
        self._lock: Optional[FileLock] = None

    @property
    def held(self) -> bool:
        return self._lock is not None

    def holder(self, default: str = "another process") -> str:
        """What the current (or last) holder wrote in the lock file."""
        try:
            text = self.path.read_text().strip()
        except OSError:
            return default
        return text or default  # empty: a holder that has not written yet

    def acquire(self, wait: bool = False,
                on_wait: Optional[Callable[[str], None]] = None) -> "OwnerLock":
        """Take the lock at once, or raise :class:`OwnerLockBusy`; with ``wait``, call
        ``on_wait(holder text)`` once and block until the holder releases it."""
        if self._lock is not None:
            raise RuntimeError(f"{self.path}: this OwnerLock is already held")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.path, thread_local=False, poll_interval=POLL,
                        on_acquired=self._write_owner)
        try:
            lock.acquire(blocking=False)
        except Timeout:
            owner = self.holder()
            if not wait:
                raise OwnerLockBusy(self.path, owner) from None
            if on_wait is not None:
                on_wait(owner)
            while True:  # bounded slices: an unbounded wait may raise filelock's "Deadlock"
                try:
                    lock.acquire(timeout=WAIT_SLICE)
                    break
                except Timeout:
                    continue
        self._lock = lock
        return self

    def release(self) -> None:
        """Release the lock (a no-op when not held). The lock file stays, with its text."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release(force=True)

    def _write_owner(self, fd: int) -> None:
        text = f"{self.owner} pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)

    def __enter__(self) -> "OwnerLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
