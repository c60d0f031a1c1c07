#!/usr/bin/env bash
# The README's test command: set up (idempotent) and run the whole test suite on CPU.
#   bash scripts/test.sh [extra pytest args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
VENV="${SLAPO_VENV:-$ROOT/.venv}"
cd "$ROOT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Two workers: multi-rank tests spawn their own gloo ranks, so more would oversubscribe 2 cores.
set +e
"$VENV/bin/python" -m pytest -n "${SLAPO_TEST_WORKERS:-2}" --dist loadfile "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "test.sh: ERROR: pytest collected no tests (exit 5); the suite must not be empty" >&2
fi
exit $rc
