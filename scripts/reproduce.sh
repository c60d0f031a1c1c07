#!/usr/bin/env bash
# Every figure and table of the paper, at CPU scale and at the paper's scale predicted, in one
# resumable command that ends with one page (DIR/index.md + DIR/index.html):
#   bash scripts/reproduce.sh [--quick | --full] [--out DIR] [--steps A,B] [--list] [--dry-run]
# --quick (default): about 15 minutes on 2 idle cores, tiny models, one panel per prediction;
# --full: the committed studies' own commands (hours). Details: --help (end2end/reproduce/).
# Runs scripts/setup.sh first unless SKIP_SETUP=1 or PYTHON=... is given; run from anywhere.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for arg in "$@"; do
  case "$arg" in -h|--help|--list|--dry-run) SKIP_SETUP=1 ;; esac
done
if [[ -z "${PYTHON:-}" && "${SKIP_SETUP:-0}" != 1 ]]; then
  bash "$ROOT/scripts/setup.sh"
fi
PY="${PYTHON:-$ROOT/.venv/bin/python}"
ARGS=()
for arg in "$@"; do   # --out is relative to the caller's directory
  if [[ "${prev:-}" == --out && "$arg" != /* ]]; then arg="$PWD/$arg"; fi
  case "$arg" in --out=*) [[ "${arg#--out=}" == /* ]] || arg="--out=$PWD/${arg#--out=}" ;; esac
  ARGS+=("$arg"); prev="$arg"
done
cd "$ROOT"
exec "$PY" -m end2end.reproduce ${ARGS[@]+"${ARGS[@]}"}
