#!/usr/bin/env bash
# Run every line of a benchmark config (the artifact's entry point), then plot Figure 7.
#   bash end2end/run_all_single_node.sh end2end/configs/cpu.cfg [extra end2end.sweep args]
# Results go to ${RESULTS:-results/<config name>.tsv}; re-running resumes where it stopped.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CFG="${1:?usage: run_all_single_node.sh CONFIG [sweep args]}"
shift
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
NAME="$(basename "$CFG" .cfg)"
RESULTS="${RESULTS:-results/$NAME.tsv}"
DEVICE="${DEVICE:-$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd "$ROOT"
"$PY" -m end2end.sweep "$CFG" --results "$RESULTS" --device "$DEVICE" "$@"
"$PY" -m end2end.plot "$RESULTS" -o "${RESULTS%.tsv}-fig7" --title "$NAME on $DEVICE"
