import pytest

from slapo.testing import run_distributed


@pytest.fixture(scope="session")
def results():
    """Every 2-rank check of this directory, from one spawn (per-rank result dicts)."""
    from tests.verification.test_fault_injection import run_all

    return run_distributed(run_all, 2, timeout=400)
