#!/usr/bin/env bash
# One-command, idempotent set-up: creates .venv (if missing) with the pinned stack and installs
# slapo in editable mode. Fast when everything is already in place.
#
#   bash scripts/setup.sh          # create / update .venv
#   SLAPO_VENV=/path bash scripts/setup.sh
#   SLAPO_TORCH=cuda bash scripts/setup.sh   # which torch build: cpu, cuda or auto (default)
#
# Prerequisites (checked, one-line error each): Linux, Python >= 3.11 with its venv module
# (PYTHON=... picks another interpreter), ~3 GB free disk for a CPU venv (~8 GB with the CUDA
# build of torch), and pip's package index reachable (PyPI, or a mirror pip is configured for).
#
# torch build: SLAPO_TORCH=auto keeps the pinned torch already in the venv (either build), else
# takes the CUDA build when `nvidia-smi -L` lists a GPU, else the CPU build. The CPU build is asked for as `torch==<pin>+cpu`: first from the indexes pip is
# already configured with (on machines that keep the wheel locally, nothing is downloaded and no
# other index is contacted), then from PyTorch's CPU index (SLAPO_TORCH_INDEX, default
# https://download.pytorch.org/whl/cpu). The CUDA build is plain `torch==<pin>` from PyPI.
#
# A GPU machine that already has torch >= 2.11 and transformers >= 5.17 installed can skip this and
# run `pip install -e ".[hf,bench,test]"` into its own environment.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SLAPO_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.slapo-setup-stamp"

fail() { echo "setup.sh: ERROR: $*" >&2; exit 1; }
step() { echo "setup.sh: $*"; }

# Which torch build (see above).
TORCH_BUILD="${SLAPO_TORCH:-auto}"
torch_pin="$(grep -E '^torch==' "$ROOT/requirements.txt" | head -1)"
want_torch="${torch_pin#torch==}"
installed="$("$VENV/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
case "$TORCH_BUILD" in
  auto) if [[ ${installed%%+*} == "$want_torch" ]]; then  # keep the pinned build already there
          [[ $installed == *+cpu ]] && TORCH_BUILD=cpu || TORCH_BUILD=cuda
        elif command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU; then
          TORCH_BUILD=cuda; else TORCH_BUILD=cpu; fi ;;
  cpu|cuda) ;;
  *) fail "SLAPO_TORCH=$TORCH_BUILD is not a torch build; use cpu, cuda or auto" ;;
esac

# The stamp records the hash of the files that define the environment (and the torch build); if
# they have not changed and the stamp exists, there is nothing to do.
want_hash="$( (cat "$ROOT/requirements.txt" "$ROOT/pyproject.toml"; echo "$TORCH_BUILD") \
             | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want_hash" ]] && "$VENV/bin/python" -c "import slapo" 2>/dev/null; then
  step "environment up to date ($VENV)"
  exit 0
fi

[[ "$(uname -s)" == Linux ]] || fail "Linux is required (this is $(uname -s)); use the Docker image (docker/README.md)"
if [[ ! -x "$VENV/bin/python" ]]; then
  command -v "$PY" >/dev/null || fail "'$PY' not found; install Python >= 3.11 or set PYTHON=..."
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || fail "$("$PY" -V 2>&1) is too old; install Python >= 3.11 or set PYTHON=..."
  need_gb=$([[ $TORCH_BUILD == cuda ]] && echo 8 || echo 3)
  mkdir -p "$(dirname "$VENV")"
  free_gb=$(df -Pk "$(dirname "$VENV")" | awk 'NR==2 {print int($4 / 1048576)}')
  (( free_gb >= need_gb )) \
    || fail "only ${free_gb} GB free at $(dirname "$VENV"); the $TORCH_BUILD venv needs ~${need_gb} GB (SLAPO_VENV=... puts it elsewhere)"
  step "creating virtual environment at $VENV"
  "$PY" -m venv "$VENV" || fail "could not create a venv with '$PY -m venv $VENV' (is python3-venv installed?)"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)

if [[ $TORCH_BUILD == cpu && $installed == "$want_torch+cpu" ]] \
   || [[ $TORCH_BUILD == cuda && $installed == "$want_torch"* && $installed != *+cpu ]]; then
  step "torch $installed already installed"
elif [[ $TORCH_BUILD == cpu ]]; then
  step "installing torch==$want_torch+cpu (the CPU build; SLAPO_TORCH=cuda for the CUDA build)"
  "${PIP[@]}" "torch==$want_torch+cpu" 2>/dev/null \
    || "${PIP[@]}" "torch==$want_torch+cpu" \
         --extra-index-url "${SLAPO_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" \
    || fail "pip could not install torch==$want_torch+cpu from pip's indexes or ${SLAPO_TORCH_INDEX:-https://download.pytorch.org/whl/cpu} (no network? set SLAPO_TORCH_INDEX to a reachable mirror)"
else
  step "installing $torch_pin (the CUDA build, from PyPI: several GB)"
  "${PIP[@]}" "$torch_pin" || fail "pip could not install $torch_pin (no network to the package index?)"
fi

step "installing pinned requirements (DS_BUILD_OPS=0: no DeepSpeed C++ ops are compiled)"
DS_BUILD_OPS=0 "${PIP[@]}" -r "$ROOT/requirements.txt" \
  || fail "pip could not install requirements.txt (no network to the package index?)"

step "installing slapo (editable)"
"${PIP[@]}" --no-deps -e "$ROOT" || fail "pip could not install the slapo package from $ROOT"

"$VENV/bin/python" - "$want_torch" "$TORCH_BUILD" <<'PY' || fail "installed torch does not match the pin and build"
import sys, torch
version, build = sys.argv[1], sys.argv[2]
assert torch.__version__.split("+")[0] == version, f"torch {torch.__version__} != {version}"
assert (torch.__version__.endswith("+cpu")) == (build == "cpu"), \
    f"torch {torch.__version__} is not the {build} build"
PY
echo "$want_hash" > "$STAMP"
step "done ($VENV)"
