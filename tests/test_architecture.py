"""The architecture stays visible and enforced, for the schedule language (``slapo/``, contract
``slapo-layers``) and for the benchmark harness (``end2end/``, contract ``end2end-layers``) alike:
few loose modules, every package and loose module in a layer of its contract, the contract and
its map in ``docs/internals.md`` say the same, and a broken layer really fails ``lint-imports``
(checked on a copy of the packages)."""

import pathlib
import re
import shutil
import subprocess
import sys
import tomllib
from typing import NamedTuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
INTERNALS = ROOT / "docs" / "internals.md"
LINT_IMPORTS = pathlib.Path(sys.executable).with_name("lint-imports")
MAX_LOOSE_MODULES = 8


class Layered(NamedTuple):
    """A package under a layers contract, and what checks it."""

    package: str          # the directory at the repository root
    contract: str         # its layers contract in pyproject.toml
    map_heading: str      # the section of docs/internals.md whose table draws the layers
    copied: tuple         # packages the copy that lint-imports checks holds
    contracts: tuple      # the contracts checked on that copy


SLAPO = Layered("slapo", "slapo-layers", "## The map: packages and their layers",
                copied=("slapo",), contracts=("slapo-layers", "slapo-no-harness"))
END2END = Layered("end2end", "end2end-layers", "## The harness map: end2end/ and its layers",
                  copied=("slapo", "end2end"),
                  contracts=("slapo-layers", "slapo-no-harness", "end2end-layers"))
# The harness under the study suites: end2end never imports them (checked on a copy with them).
SUITES = Layered("end2end", "end2end-no-suites", "", copied=("slapo", "end2end", "ablation",
                                                             "autotune", "usability"),
                 contracts=("end2end-no-suites",))
EACH_PACKAGE = pytest.mark.parametrize("layered", [SLAPO, END2END], ids=lambda p: p.package)


def _importlinter() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _contract(contract_id: str) -> dict:
    contracts = {c["id"]: c for c in _importlinter()["contracts"]}
    return contracts[contract_id]


def _layer_members(layer: str) -> list:
    return [m.strip() for m in re.split(r"[|:]", layer.strip("()"))]


def _map_section(layered: Layered) -> str:
    """The text of the package's map in docs/internals.md, up to the next section."""
    return INTERNALS.read_text().split(layered.map_heading + "\n", 1)[1].split("\n## ", 1)[0]


@EACH_PACKAGE
def test_few_loose_modules(layered):
    loose = sorted(p.name for p in (ROOT / layered.package).glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, (
        f"{layered.package}/ has {len(loose)} loose modules ({', '.join(loose)}); group them into "
        f"packages by concern (at most {MAX_LOOSE_MODULES}, see docs/internals.md)")


def _unlayered(directory: pathlib.Path, layered: Layered) -> list:
    """Packages and loose modules of ``directory`` that no layer of the contract names."""
    layers = _contract(layered.contract)["layers"]
    in_a_layer = {m for layer in layers for m in _layer_members(layer)}
    present = {p.name for p in directory.iterdir() if (p / "__init__.py").is_file()}
    present |= {p.stem for p in directory.glob("*.py") if p.name != "__init__.py"}
    return sorted(present - in_a_layer)


def _where_to_add(layered: Layered, missing: list) -> str:
    return (f"{missing} in {layered.package}/ belong to no layer of the '{layered.contract}' "
            "contract, so nothing checks their imports; add each to a row of that contract in "
            f"pyproject.toml and of the table under '{layered.map_heading}' in docs/internals.md")


@EACH_PACKAGE
def test_every_package_and_module_is_in_a_layer(layered):
    missing = _unlayered(ROOT / layered.package, layered)
    assert not missing, _where_to_add(layered, missing)


def test_a_new_package_in_no_layer_is_found(tmp_path):
    # The check above can fail: a package and a module that no layer names are reported.
    copy = shutil.copytree(ROOT / "end2end", tmp_path / "end2end",
                           ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "telemetry").mkdir()
    (copy / "telemetry" / "__init__.py").write_text("")
    (copy / "notes.py").write_text("")
    missing = _unlayered(copy, END2END)
    assert missing == ["notes", "telemetry"]
    assert "pyproject.toml" in _where_to_add(END2END, missing)
    assert END2END.map_heading in _where_to_add(END2END, missing)


@EACH_PACKAGE
def test_internals_map_matches_the_contract(layered):
    rows = re.findall(r"^\| `([^`]+)` \|", _map_section(layered), flags=re.M)
    documented = [row.replace("\\|", "|") for row in rows]
    assert documented == _contract(layered.contract)["layers"], (
        f"the table under '{layered.map_heading}' in docs/internals.md and the "
        f"'{layered.contract}' contract in pyproject.toml differ")


def test_the_harness_map_names_every_module():
    """Each ``- `package/`: ...`` line of the harness map names every module of that package."""
    listed = dict(re.findall(r"^- `(\w+)/`(.*)$", _map_section(END2END), flags=re.M))
    for package in sorted(p for p in (ROOT / "end2end").iterdir() if (p / "__init__.py").is_file()):
        members = [p.name for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")]
        members += [f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()]
        unnamed = sorted(m for m in members if f"`{m}`" not in listed.get(package.name, ""))
        assert not unnamed, (
            f"end2end/{package.name}/: {unnamed} missing from its line in the harness map of "
            f"docs/internals.md ('- `{package.name}/`: `module.py` what it holds; ...')")


def _copy_packages(tmp_path: pathlib.Path, layered: Layered) -> pathlib.Path:
    """The packages and a pyproject holding only the real contracts, in a fresh directory."""
    for package in layered.copied:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    config = _importlinter()
    lines = ["[tool.importlinter]", f"root_packages = {_toml(list(layered.copied))}",
             "include_external_packages = true", "exclude_type_checking_imports = true"]
    assert config["include_external_packages"] and config["exclude_type_checking_imports"]
    for contract_id in layered.contracts:
        lines.append("\n[[tool.importlinter.contracts]]")
        for key, value in _contract(contract_id).items():
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


@EACH_PACKAGE
def test_the_unchanged_copy_keeps_the_contracts(tmp_path, layered):
    kept = _lint(_copy_packages(tmp_path, layered))
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert f"{len(layered.contracts)} kept, 0 broken" in kept.stdout


BROKEN_LAYERS = [  # (package, module, the import appended to it, what lint-imports says)
    (SLAPO, "sharding/spec.py", "from ..model_schedule import registry",
     "slapo.sharding is not allowed to import slapo.model_schedule"),
    (SLAPO, "op/fused.py", "from ..primitives import registry",
     "slapo.op is not allowed to import slapo.primitives"),
    (SLAPO, "primitives/shard.py", "import end2end",
     "slapo is not allowed to import end2end"),
    (SLAPO, "pipeline/stages.py", "from ..trace import tracer",
     "slapo.pipeline is not allowed to import slapo.trace"),
    # The harness: results are read and drawn without the driver; the driver never imports the
    # sweep; the zoo knows no specs, specs know no results; packages never use the command names.
    (END2END, "results/stats.py", "from end2end.driver import measure",
     "end2end.results is not allowed to import end2end.driver"),
    (END2END, "models/zoo.py", "from ..spec import expr",
     "end2end.models is not allowed to import end2end.spec"),
    (END2END, "driver/measure.py", "from end2end.sweep import progress",
     "end2end.driver is not allowed to import end2end.sweep"),
    (END2END, "spec/expr.py", "from end2end.results import stats",
     "end2end.spec is not allowed to import end2end.results"),
    (END2END, "sweep/lock.py", "import end2end.bench",
     "end2end.sweep is not allowed to import end2end.bench"),
    # A lazy import counts: the report once imported the suites inside its functions.
    (SUITES, "report/paper.py", "def _late():\n    import autotune.seeds",
     "end2end is not allowed to import autotune"),
]


@pytest.mark.parametrize("layered, module, line, message", BROKEN_LAYERS,
                         ids=[f"{case[0].package}/{case[1]}" for case in BROKEN_LAYERS])
def test_a_broken_layer_fails(tmp_path, layered, module, line, message):
    copy = _copy_packages(tmp_path, layered)
    with open(copy / layered.package / module, "a") as f:
        f.write(f"\n{line}  # noqa: E402,F401\n")
    broken = _lint(copy)
    assert broken.returncode != 0
    assert message in broken.stdout, broken.stdout + broken.stderr


def _source_files() -> list:
    return sorted(str(p.relative_to(ROOT)) for folder in ("slapo", "end2end", "ablation",
                                                           "autotune", "usability", "scripts")
                  for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_no_source_file_is_ignored_by_git_or_docker():
    """A package whose folder an ignore file names (``end2end/results/`` once held output) would
    be missing from a clone and from the images."""
    git = shutil.which("git")
    if git and (ROOT / ".git").exists():
        ignored = subprocess.run([git, "check-ignore", "--no-index", *_source_files()], cwd=ROOT,
                                 capture_output=True, text=True).stdout.split()
        assert not ignored, f".gitignore hides source files: {ignored}"
    packages = {str(p.parent.relative_to(ROOT)) for p in ROOT.glob("*/**/__init__.py")}
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    hidden = [ln for ln in lines if ln.strip().rstrip("/") in packages]
    assert not hidden, f".dockerignore hides packages: {hidden}"
