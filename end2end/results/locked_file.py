"""Appending lines to files that several processes write: an ``flock`` around each append,
one ``write`` per line, ``fsync`` after it, a torn last line closed off first (used by
:mod:`end2end.results.store` for results files and their JSON twins)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["Locked", "append_line"]


class Locked:
    """``with Locked(path, exclusive) as fh``: ``path`` opened for append+read (binary) under
    an ``flock``. Appends take it exclusively on the TSV around *both* writes (twin, then TSV),
    readers shared, so rows reach the two files in one order even with concurrent writers."""

    def __init__(self, path: Path, exclusive: bool = True):
        self.path, self.mode = path, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH

    def __enter__(self):
        self.fh = open(self.path, "a+b")
        fcntl.flock(self.fh, self.mode)
        return self.fh

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def append_line(fh, text: str, header: str = "") -> None:
    """Append ``text`` (one line) to the locked ``fh``; ``header`` first if the file is empty;
    a torn last line (a writer killed mid-write) is closed off first."""
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
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
