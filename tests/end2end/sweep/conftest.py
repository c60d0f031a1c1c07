"""Fixtures of the sweep tests."""

import subprocess
import sys

import pytest

HOG = [sys.executable, "-c", "while True: pass"]


@pytest.fixture
def hog():
    """A CPU-heavy process beside the test (stopped, by its pid, at the end): the machine is
    busy while it runs (the quiet-machine guard's tests, issue 38)."""
    proc = subprocess.Popen(HOG)
    yield proc
    proc.kill()
    proc.wait()
