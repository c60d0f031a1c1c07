"""Files that several processes append to (a results TSV and its JSON-lines twin): one lock
around each append and each read, one ``write`` per line, ``fsync`` after it, a torn last line
closed off first. Used by :mod:`end2end.results.store`.

The lock is :class:`filelock.FileLock` on a *sidecar* file, ``<results>.append.lock``, not on
the results file itself: filelock locks a file of its own (it creates it, and keeps it so that
waiters share one inode), and that file must be neither the TSV (whose bytes are the data) nor
``<results>.lock``, which :class:`~end2end.sweep.lock.SweepLock` holds for a sweep's whole
lifetime — the sweep's own ranks append rows meanwhile, so one name for both would deadlock
them. Writers hold it around *both* writes of a row (twin, then TSV) and readers around reading
both files, so a row reaches the two files in one order and no reader sees half of a pair,
whichever rank or process appends (readers take it exclusively too: a read takes milliseconds).
A reader that cannot create the sidecar (a results file in a directory it may not write, e.g.
someone else's results) reads without it; a half-appended pair then shows as the usual
twin-mismatch warning, never as a wrong row.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, Optional, Tuple, Union

from filelock import FileLock

__all__ = ["append_lock", "lock_path", "append_line", "read_locked"]

POLL_SECONDS = 0.005  # a waiting writer retries this often (an append holds the lock ~1 ms)


def lock_path(path: Union[str, Path]) -> Path:
    """``results/cpu.tsv`` -> ``results/cpu.tsv.append.lock`` (the sweep's is ``cpu.tsv.lock``)."""
    path = Path(path)
    return path.with_name(path.name + ".append.lock")


def append_lock(path: Union[str, Path]) -> FileLock:
    """The lock that appends to ``path`` (and its twin) and reads of it take (waits forever, as
    an append is short)."""
    return FileLock(lock_path(path), poll_interval=POLL_SECONDS)


def append_line(path: Path, text: str, header: str = "") -> None:
    """Append ``text`` (one line) to ``path`` — the caller holds :func:`append_lock` —;
    ``header`` first if the file is empty or new; a torn last line (a writer killed mid-write)
    is closed off first, so the new row starts on a line of its own."""
    with open(path, "a+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        data = b""
        if size == 0:
            data += header.encode()
        else:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":
                data += b"\n"
        data += text.encode() + b"\n"
        fh.seek(0, os.SEEK_END)
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def read_locked(path: Path, twin: Optional[Path]) -> Tuple[bytes, Optional[bytes]]:
    """The bytes of ``path`` and of ``twin`` (None: not asked for, or absent), read under
    :func:`append_lock` so that no half-appended row pair is read. Raises ``OSError`` when
    ``path`` cannot be read."""
    path.stat()  # a missing file is an error, not a reason to create its sidecar
    with _reader_lock(path):
        data = path.read_bytes()
        twin_data = twin.read_bytes() if twin is not None and twin.exists() else None
    return data, twin_data


@contextlib.contextmanager
def _reader_lock(path: Path) -> Iterator[None]:
    lock = append_lock(path)
    try:
        lock.acquire()
    except OSError:  # the sidecar cannot be created here: no writer of ours appends here
        yield
        return
    try:
        yield
    finally:
        lock.release()
