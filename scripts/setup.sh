#!/usr/bin/env bash
# One-command, idempotent set-up: creates .venv (if missing) with the pinned stack and installs
# slapo in editable mode. Fast when everything is already in place.
#
#   bash scripts/setup.sh          # create / update .venv
#   SLAPO_VENV=/path bash scripts/setup.sh
#
# A GPU machine that already has torch >= 2.11 and transformers >= 5.17 installed can skip this and
# run `pip install -e .` into its own environment.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SLAPO_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.slapo-setup-stamp"

fail() { echo "setup.sh: ERROR: $*" >&2; exit 1; }
step() { echo "setup.sh: $*"; }

# The stamp records the hash of the files that define the environment; if they have not changed
# and the stamp exists, there is nothing to do.
want_hash="$(cat "$ROOT/requirements.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want_hash" ]] && "$VENV/bin/python" -c "import slapo" 2>/dev/null; then
  step "environment up to date ($VENV)"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  command -v "$PY" >/dev/null || fail "'$PY' not found; install Python >= 3.10 or set PYTHON=..."
  step "creating virtual environment at $VENV"
  "$PY" -m venv "$VENV" || fail "could not create a venv with '$PY -m venv $VENV' (is python3-venv installed?)"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)

torch_pin="$(grep -E '^torch==' "$ROOT/requirements.txt" | head -1)"
step "installing $torch_pin (CPU wheel when no CUDA build is cached)"
"${PIP[@]}" "$torch_pin" || fail "pip could not install $torch_pin"

step "installing pinned requirements (DS_BUILD_OPS=0: no DeepSpeed C++ ops are compiled)"
DS_BUILD_OPS=0 "${PIP[@]}" -r "$ROOT/requirements.txt" || fail "pip could not install requirements.txt"

step "installing slapo (editable)"
"${PIP[@]}" --no-deps -e "$ROOT" || fail "pip could not install the slapo package from $ROOT"

want_torch="${torch_pin#torch==}"
"$VENV/bin/python" - "$want_torch" <<'PY' || fail "installed torch does not match the pin"
import sys, torch
assert torch.__version__.startswith(sys.argv[1]), f"torch {torch.__version__} != {sys.argv[1]}"
PY
echo "$want_hash" > "$STAMP"
step "done ($VENV)"
