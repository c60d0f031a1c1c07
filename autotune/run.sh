#!/usr/bin/env bash
# Figure 10 at CPU scale: the grid (ground truth), the original Slapo search and TPE over batch
# size x checkpoint ratio for one model; study database results/autotune-<model>.db (one study
# per strategy), the driver's rows in results/autotune-<model>.tsv, the figure beside them.
#
#   bash autotune/run.sh                 # MODEL=bert (spaces/bert.py); MODEL=gpt_neo also
#   REPLAY=0 bash autotune/run.sh        # search and TPE measure their candidates themselves
#   SEARCH_BUDGET=12 TPE_BUDGET=8 ...    # budgets (default: a third of the grid each)
#   SEEDS=10                             # TPE seeds replayed on the grid at the end (autotune.seeds)
#   bash autotune/run.sh --require-quiet # every measured candidate waits for a quiet machine
#                                        # (QUIET_WAIT=300 s at most), else the tuner stops in
#                                        # one line; without it each row's Machine cell says
#                                        # whether the machine was quiet (end2end/sweep/quiet.py)
#
# Resumable: run it again after an interruption; finished candidates are not measured again.
# With REPLAY=1 (default) the search and TPE are answered from the grid's measurements
# (autotune/replay.py): one measurement per candidate, the same numbers for every strategy.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
for arg in "$@"; do
  case "$arg" in
    --require-quiet) export AUTOTUNE_QUIET_WAIT="${QUIET_WAIT:-300}" ;;
    *) echo "run.sh: unknown argument '$arg' (the only one is --require-quiet)" >&2; exit 2 ;;
  esac
done
MODEL="${MODEL:-bert}"
SPACE="${SPACE:-autotune/spaces/${MODEL}.py}"  # SPACE=file: another space (tests)
[[ -f "$SPACE" ]] || { echo "run.sh: no space file $SPACE" >&2; exit 2; }
if [[ -z "${PYTHON:-}" && -z "${SKIP_SETUP:-}" ]]; then bash scripts/setup.sh; fi
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
RESULTS_DIR="${RESULTS_DIR:-$ROOT/results}"
mkdir -p "$RESULTS_DIR"
NAME="autotune-${MODEL//_/-}"
DB="$RESULTS_DIR/$NAME.db"
export AUTOTUNE_RESULTS="$RESULTS_DIR/$NAME.tsv"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# the number of candidates; a broken space file is one line (file:line: what. Hint: ...), exit 2
N=$("$PYTHON" - "$SPACE" <<'PY'
import sys

from slapo.autotune.cli import load_space_file
from slapo.errors import SlapoError

try:
    print(len(load_space_file(sys.argv[1])["space"].candidates()))
except SlapoError as exc:
    sys.exit("autotune/run.sh: error: " + " ".join(str(exc).split()))
PY
) || exit 2
SEARCH_BUDGET="${SEARCH_BUDGET:-$(( (N + 2) / 3 ))}"
TPE_BUDGET="${TPE_BUDGET:-$(( N / 3 ))}"
echo "run.sh: $MODEL, $N candidates; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
START=$(date +%s)
"$PYTHON" -m slapo.autotune --space "$SPACE" --strategy grid --budget "$N" --db "$DB"
REPLAY_CMD=()
if [[ "${REPLAY:-1}" == 1 ]]; then
  REPLAY_CMD=(-- "$PYTHON" -m autotune.replay --db "$DB" --study grid
              --param "batch_size={batch_size}" --param "ckpt_ratio={ckpt_ratio}")
fi
"$PYTHON" -m slapo.autotune --space "$SPACE" --strategy search --budget "$SEARCH_BUDGET" \
    --db "$DB" "${REPLAY_CMD[@]}"
"$PYTHON" -m slapo.autotune --space "$SPACE" --strategy tpe --budget "$TPE_BUDGET" \
    --db "$DB" "${REPLAY_CMD[@]}"
"$PYTHON" -m autotune.plot "$DB" -o "$RESULTS_DIR/$NAME" --title "$MODEL (CPU): throughput"
# every strategy over seeds on the grid's measurements (nothing measured again): the claim table
"$PYTHON" -m autotune.seeds --db "$DB" --space "$SPACE" --seeds "${SEEDS:-10}" \
    --budget "$TPE_BUDGET" --json "$RESULTS_DIR/$NAME-seeds.jsonl" | tee "$RESULTS_DIR/$NAME-seeds.md"
echo "run.sh: done in $(( $(date +%s) - START )) s; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
