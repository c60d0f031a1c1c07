"""The architecture stays visible and enforced: few loose modules in ``slapo/``, every package in
a layer of the ``slapo-layers`` contract, the contract and the map in ``docs/internals.md`` say
the same, and a broken layer really fails ``lint-imports`` (checked on a copy of the package)."""

import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "slapo"
LINT_IMPORTS = pathlib.Path(sys.executable).with_name("lint-imports")
MAX_LOOSE_MODULES = 8


def _importlinter() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _contract(contract_id: str) -> dict:
    contracts = {c["id"]: c for c in _importlinter()["contracts"]}
    return contracts[contract_id]


def _layer_members(layer: str) -> list:
    return [m.strip() for m in re.split(r"[|:]", layer.strip("()"))]


def test_few_loose_modules():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, (
        f"slapo/ has {len(loose)} loose modules ({', '.join(loose)}); group them into packages "
        f"by concern (at most {MAX_LOOSE_MODULES}, see docs/internals.md)")


def test_every_package_and_module_is_in_a_layer():
    layered = {m for layer in _contract("slapo-layers")["layers"] for m in _layer_members(layer)}
    present = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    present |= {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    missing = sorted(present - layered)
    assert not missing, (
        f"{missing} in slapo/ belong to no layer of the 'slapo-layers' contract, so nothing "
        "checks their imports; add them to a row of pyproject.toml and docs/internals.md")


def test_internals_map_matches_the_contract():
    text = (ROOT / "docs" / "internals.md").read_text()
    section = text.split("## The map: packages and their layers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)
    documented = [row.replace("\\|", "|") for row in rows]
    assert documented == _contract("slapo-layers")["layers"], (
        "docs/internals.md's layer table and the 'slapo-layers' contract in pyproject.toml differ")


def _copy_package(tmp_path: pathlib.Path) -> pathlib.Path:
    """``slapo/`` and a pyproject holding only the real contracts, in a fresh directory."""
    shutil.copytree(PACKAGE, tmp_path / "slapo", ignore=shutil.ignore_patterns("__pycache__"))
    config = _importlinter()
    contracts = [_contract("slapo-layers"), _contract("slapo-no-harness")]
    lines = ["[tool.importlinter]", 'root_packages = ["slapo"]',
             "include_external_packages = true", "exclude_type_checking_imports = true"]
    assert config["include_external_packages"] and config["exclude_type_checking_imports"]
    for c in contracts:
        lines.append("\n[[tool.importlinter.contracts]]")
        for key, value in c.items():
            lines.append(f"{key} = {_toml(value)}")
    (tmp_path / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return tmp_path


def _toml(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _lint(cwd: pathlib.Path) -> subprocess.CompletedProcess:
    # The copy comes first on the path, so it is analysed rather than the installed package.
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=cwd,
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(cwd)})


def test_the_unchanged_copy_keeps_the_contracts(tmp_path):
    kept = _lint(_copy_package(tmp_path))
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "2 kept, 0 broken" in kept.stdout


@pytest.mark.parametrize("module, line, message", [
    ("sharding/spec.py", "from ..model_schedule import registry",
     "slapo.sharding is not allowed to import slapo.model_schedule"),
    ("op/fused.py", "from ..primitives import registry",
     "slapo.op is not allowed to import slapo.primitives"),
    ("primitives/shard.py", "import end2end",
     "slapo is not allowed to import end2end"),
    ("pipeline/stages.py", "from ..trace import tracer",
     "slapo.pipeline is not allowed to import slapo.trace"),
])
def test_a_broken_layer_fails(tmp_path, module, line, message):
    copy = _copy_package(tmp_path)
    with open(copy / "slapo" / module, "a") as f:
        f.write(f"\n{line}  # noqa: E402,F401\n")
    broken = _lint(copy)
    assert broken.returncode != 0
    assert message in broken.stdout, broken.stdout + broken.stderr
