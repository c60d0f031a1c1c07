"""scripts/setup.sh checks its prerequisites and its torch build choice with one-line errors
before it creates or installs anything (issue 26). The installing path itself runs in CI on
every clean clone (.ci/run -> scripts/test.sh -> scripts/setup.sh)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _setup(tmp_path, **env):
    venv = tmp_path / "venv"
    run = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True,
                         text=True, env={**os.environ, "SLAPO_VENV": str(venv), **env},
                         timeout=60)
    return run, venv


@pytest.mark.parametrize("env, message", [
    ({"SLAPO_TORCH": "rocm"}, "SLAPO_TORCH=rocm is not a torch build; use cpu, cuda or auto"),
    ({"PYTHON": "/no/such/python3"}, "'/no/such/python3' not found; install Python >= 3.11"),
    ({"PYTHON": "OLD"}, "Python 3.8.10 is too old; install Python >= 3.11"),
    ({"PYTHON": "3.10"}, "Python 3.10.12 is too old; install Python >= 3.11"),
])
def test_bad_prerequisites_give_one_line_errors_and_create_nothing(tmp_path, env, message):
    if env.get("PYTHON") in ("OLD", "3.10"):  # an interpreter that says it is Python 3.8/3.10
        version = "3.8.10" if env["PYTHON"] == "OLD" else "3.10.12"
        old = tmp_path / "python-old"
        old.write_text(f'#!/bin/sh\n[ "$1" = -V ] && echo "Python {version}" && exit 0\nexit 1\n')
        old.chmod(0o755)
        env = {"PYTHON": str(old)}
    run, venv = _setup(tmp_path, **env)
    assert run.returncode == 1, run
    errors = [line for line in run.stderr.splitlines() if line.startswith("setup.sh: ERROR")]
    assert len(errors) == 1 and message in errors[0], run.stderr
    assert not venv.exists()


def test_an_up_to_date_environment_is_left_alone():
    """The project's own .venv (made by this script before the tests ran) is reported up to
    date, for the build it was made with, in well under a minute."""
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("the tests do not run in the project's .venv")
    import torch

    build = "cpu" if torch.__version__.endswith("+cpu") else "cuda"
    run = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True,
                         text=True, env={**os.environ, "SLAPO_TORCH": build}, timeout=60)
    assert run.returncode == 0 and "environment up to date" in run.stdout, run
