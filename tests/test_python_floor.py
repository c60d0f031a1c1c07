"""The oldest Python the project supports (issue 38 item 3) is the oldest one every pin of
requirements.txt installs on, and every place that states or checks it says the same.

The floor is computed from the pinned packages' own ``Requires-Python`` metadata (as installed in
this environment), not typed into the test: a pin that raises its floor fails the test until the
set-up script, pyproject.toml and the README follow.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import tomllib
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = [Version(f"3.{minor}") for minor in range(6, 20)]


def _pins() -> List[Tuple[str, str]]:
    """``(name, version)`` of every ``name==version`` line of requirements.txt."""
    pins = []
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"requirements.txt: {line!r} is not an exact pin"
            pins.append((name.strip(), version.strip()))
    return pins


def _requires_python() -> Dict[str, SpecifierSet]:
    """Each pin's ``Requires-Python`` (pins without one accept any Python)."""
    out = {}
    for name, version in _pins():
        try:
            meta = metadata.metadata(name)
        except metadata.PackageNotFoundError:
            pytest.skip(f"{name} is not installed here (run bash scripts/setup.sh)")
        assert meta["Version"].split("+")[0] == version, (
            f"{name} {meta['Version']} is installed, requirements.txt pins {version}: "
            "run bash scripts/setup.sh")
        out[name] = SpecifierSet(meta.get("Requires-Python") or "")
    return out


def pins_floor() -> Version:
    """The oldest 3.x minor release that every pin accepts."""
    specs = _requires_python()
    for candidate in CANDIDATES:
        if all(spec.contains(candidate, prereleases=True) for spec in specs.values()):
            return candidate
    raise AssertionError(f"no Python 3.6-3.19 satisfies every pin: {specs}")


def stated_floors() -> Dict[str, str]:
    """Where the floor is stated or checked -> the version it states there."""
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    readme = (ROOT / "README.md").read_text()
    check = re.search(r"sys\.version_info < \((\d+), (\d+)\)", setup)
    found = {
        "scripts/setup.sh (its check)": ".".join(check.groups()) if check else "none",
        "pyproject.toml requires-python": pyproject["project"]["requires-python"].lstrip(">="),
        "pyproject.toml [tool.ruff] target-version":
            re.sub(r"^py3", "3.", pyproject["tool"]["ruff"]["target-version"]),
        "pyproject.toml [tool.mypy] python_version": pyproject["tool"]["mypy"]["python_version"],
    }
    for where, text in (("scripts/setup.sh", setup), ("README.md", readme)):
        for i, version in enumerate(re.findall(r"Python >= (3\.\d+)", text)):
            found[f"{where} (statement {i + 1})"] = version
    assert any(k.startswith("README.md") for k in found), "README.md states no Python floor"
    return found


def test_the_stated_floor_is_the_pins_floor():
    floor = pins_floor()
    assert floor >= Version("3.11"), floor  # what issue 38 found: numpy, pandas ... need 3.11
    wrong = {where: v for where, v in stated_floors().items() if Version(v) != floor}
    assert not wrong, (f"the pins need Python >= {floor}, but these places say otherwise: "
                       f"{wrong}; state {floor} there")


def test_the_floor_is_tight():
    """One pin at least refuses the minor release below the floor (else the floor is higher
    than the pins need)."""
    floor = pins_floor()
    below = Version(f"3.{floor.minor - 1}")
    refusing = [name for name, spec in _requires_python().items()
                if not spec.contains(below, prereleases=True)]
    assert refusing, f"every pin installs on Python {below}: the floor {floor} is too high"
