"""``isolated``: a function run in a fresh process; one killed by a signal (glibc's heap abort
in a fake world) runs once more and the retry is said; a second death, or an exception, is the
``RuntimeError`` naming the function."""

import os
import signal
from pathlib import Path

import pytest

from end2end.simulate.engine.isolated import isolated

HERE = "tests.end2end.simulate.test_isolated"


def abort_once(marker: str) -> str:
    """Dies of SIGABRT the first time (no ``marker`` yet), returns ``"second"`` after."""
    path = Path(marker)
    if not path.exists():
        path.write_text("aborted")
        os.kill(os.getpid(), signal.SIGABRT)
    return "second"


def abort_always() -> None:
    os.kill(os.getpid(), signal.SIGABRT)


def raise_error() -> None:
    raise ValueError("bad input")


def test_a_process_killed_by_a_signal_runs_once_more(tmp_path, capfd):
    assert isolated(f"{HERE}.abort_once", str(tmp_path / "marker")) == "second"
    assert "died of signal 6" in capfd.readouterr().err


def test_a_second_death_and_an_exception_are_errors_naming_the_function():
    with pytest.raises(RuntimeError, match=r"abort_always\(\) failed \(exit -6\)"):
        isolated(f"{HERE}.abort_always")
    with pytest.raises(RuntimeError, match=r"raise_error\(\) failed \(exit 1\).*bad input"):
        isolated(f"{HERE}.raise_error")
