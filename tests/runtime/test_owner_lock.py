"""One owner at a time (slapo.runtime.owner_lock, on filelock): refused at once with the holder's
text, queued with ``wait``, excluded across processes and across objects/threads of one process,
dropped by the kernel when the holder is killed, and the lock file is kept (not truncated or
deleted) on release."""

import subprocess
import sys
import threading
import time

import pytest

from slapo.errors import SlapoError
from slapo.runtime.owner_lock import OwnerLock, OwnerLockBusy

HOLD = """
import sys, time
from slapo.runtime.owner_lock import OwnerLock
lock = OwnerLock(sys.argv[1], owner="holder").acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_owner_is_refused_with_the_holders_text_and_gets_it_after_release(tmp_path):
    path = tmp_path / "sub" / "r.tsv.lock"  # the directory is made
    first = OwnerLock(path, owner="sweep").acquire()
    text = path.read_text()
    assert text.startswith("sweep pid ") and " since " in text
    with pytest.raises(OwnerLockBusy, match=r"r\.tsv\.lock is in use by sweep pid \d+ since") \
            as info:
        OwnerLock(path, owner="other").acquire()
    assert isinstance(info.value, SlapoError) and info.value.owner == text.strip()
    first.release()
    assert path.read_text() == text  # released, kept as it was
    with OwnerLock(path, owner="other") as second:
        assert second.held and path.read_text().startswith("other pid ")
    assert not second.held


def test_wait_queues_behind_a_holder_released_from_another_thread(tmp_path):
    path = tmp_path / "x.lock"
    first = OwnerLock(path, owner="first").acquire()
    threading.Timer(0.5, first.release).start()  # released by another thread
    seen = []
    start = time.monotonic()
    OwnerLock(path, owner="second").acquire(wait=True, on_wait=seen.append).release()
    assert time.monotonic() - start >= 0.4
    assert len(seen) == 1 and seen[0].startswith("first pid ")


def test_another_process_is_excluded_until_it_is_killed(tmp_path):
    path = tmp_path / "db.lock"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(OwnerLockBusy, match=rf"in use by holder pid {proc.pid} "):
            OwnerLock(path).acquire()
    finally:
        proc.kill()
        proc.wait()
    OwnerLock(path).acquire().release()  # the kernel dropped the dead holder's lock
