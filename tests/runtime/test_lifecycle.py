"""``slapo.runtime.lifecycle`` and ``slapo.teardown``: the exit drain of collective threads."""

import atexit
import subprocess
import sys
import textwrap
import threading
import time

import torch.distributed as dist

import slapo
from slapo.runtime import distributed as sd
from slapo.runtime import lifecycle


def _spin(seconds: float) -> threading.Thread:
    def body():
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    t = threading.Thread(target=body)
    t.start()
    return t


def _in_a_fresh_interpreter(code: str) -> str:
    """Run ``code`` in a new interpreter (a test process may keep C++ threads of earlier tests,
    which the drain rightly waits for) and return its stdout."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_drain_returns_after_the_grace_period_when_nothing_runs():
    waited = float(_in_a_fresh_interpreter("""
        from slapo.runtime import lifecycle
        print(lifecycle.drain_collective_threads(grace_s=0.02, max_wait_s=5))
    """))
    assert 0.02 <= waited < 1


def test_drain_waits_for_a_foreign_thread_state_until_max_wait():
    # In this process a C++ thread of an earlier test may hold a thread state: the drain must
    # still return, bounded by max_wait_s.
    waited = lifecycle.drain_collective_threads(grace_s=0.0, max_wait_s=0.3)
    assert waited < 2.0


def test_drain_waits_for_a_runnable_thread_and_is_bounded():
    t = _spin(0.4)
    waited = lifecycle.drain_collective_threads(grace_s=0.0, max_wait_s=5)
    assert waited >= 0.3, "the drain returned while another thread was still running"
    t.join()
    t = _spin(3.0)
    waited = lifecycle.drain_collective_threads(grace_s=0.0, max_wait_s=0.3)
    assert 0.3 <= waited < 2.0
    t.join()


def test_thread_states_of_python_threads_are_not_foreign():
    out = _in_a_fresh_interpreter("""
        import threading
        from slapo.runtime import lifecycle
        before = lifecycle.foreign_thread_states()
        event = threading.Event()
        t = threading.Thread(target=event.wait)
        t.start()
        print(before, lifecycle._thread_state_count(), lifecycle.foreign_thread_states())
        event.set()
        t.join()
    """)
    before, states, foreign = map(int, out.split())
    assert (before, foreign) == (0, 0)
    assert states >= 2


def test_the_exit_hook_is_registered_once_and_drains_when_distributed_is_loaded(monkeypatch):
    registered, drained = [], []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(lifecycle, "_INSTALLED", False)
    monkeypatch.setattr(lifecycle, "_USED", False)
    monkeypatch.setattr(lifecycle, "drain_collective_threads", lambda: drained.append(1))
    lifecycle.install_exit_hook()
    lifecycle.install_exit_hook()
    assert registered == [lifecycle._at_exit]
    registered[0]()
    assert drained == [1]  # torch.distributed is loaded: its groups may have lived and died
    monkeypatch.delitem(sys.modules, "torch.distributed")
    registered[0]()
    assert drained == [1]  # nothing could have started a collective thread
    lifecycle.note_distributed_use()
    registered[0]()
    assert drained == [1, 1]


def test_importing_slapo_installs_the_hook():
    assert lifecycle._INSTALLED
    assert "teardown" in slapo.__all__ and slapo.teardown is sd.teardown


def test_teardown_releases_state_drains_and_is_idempotent(monkeypatch):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    order = []
    monkeypatch.setattr(sd, "drain_collective_threads", lambda: order.append("drain"))
    sd.init_distributed()
    assert lifecycle._USED
    sd.register_teardown(lambda: order.append("runtime state"))
    slapo.teardown()
    assert order == ["runtime state", "drain"]
    assert not dist.is_initialized()
    slapo.teardown()
    assert order == ["runtime state", "drain", "drain"]


def test_teardown_clears_the_cached_data_parallel_groups(monkeypatch):
    from slapo.dialects import common

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    sd.init_distributed()
    try:
        group = common.data_parallel_group(None)
        assert common._DP_GROUPS and group is not None
    finally:
        slapo.teardown()
    assert not common._DP_GROUPS
    assert not dist.is_initialized()
