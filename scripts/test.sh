#!/usr/bin/env bash
# The README's test command: set up (idempotent), lint (ruff), check the layer contracts
# (import-linter, pyproject.toml), type-check slapo/ (mypy, pyproject.toml), and run the whole
# test suite on CPU.
#   bash scripts/test.sh [extra pytest args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
VENV="${SLAPO_VENV:-$ROOT/.venv}"
cd "$ROOT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
set +e
# Lint, layer contracts and types first (seconds; mypy takes about 2 minutes without its cache,
# .mypy_cache); the tests still run when they fail, so one run reports everything, and the exit
# status is the first failure's.
echo "test.sh: ruff check"
"$VENV/bin/ruff" check .
lint_rc=$?
echo "test.sh: lint-imports (layer contracts, see docs/internals.md)"
"$VENV/bin/lint-imports" --no-logo
layers_rc=$?
echo "test.sh: mypy (type check of slapo/, see [tool.mypy] in pyproject.toml)"
"$VENV/bin/mypy"
types_rc=$?
# Two workers: multi-rank tests spawn their own gloo ranks, so more would oversubscribe 2 cores.
"$VENV/bin/python" -m pytest -n "${SLAPO_TEST_WORKERS:-2}" --dist loadfile "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "test.sh: ERROR: pytest collected no tests (exit 5); the suite must not be empty" >&2
fi
if [[ $lint_rc -ne 0 ]]; then
  echo "test.sh: ERROR: ruff check failed (exit $lint_rc); see above" >&2
fi
if [[ $layers_rc -ne 0 ]]; then
  echo "test.sh: ERROR: a layer contract is broken (exit $layers_rc); see above and docs/internals.md" >&2
fi
if [[ $types_rc -ne 0 ]]; then
  echo "test.sh: ERROR: the type check of slapo/ failed (exit $types_rc); see above" >&2
fi
for code in "$lint_rc" "$layers_rc" "$types_rc" "$rc"; do
  if [[ $code -ne 0 ]]; then exit "$code"; fi
done
exit 0
