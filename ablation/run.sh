#!/usr/bin/env bash
# Figure 9, the progressive ablation: every step of ablation/configs/<scale>-<model>.cfg through
# the one benchmark driver (end2end.sweep -> end2end.bench), in interleaved rounds, then the
# chart and table (ablation.plot) drawn from the results file only.
#   bash ablation/run.sh [--scale cpu|paper|tiny] [--model bert|gpt-neo|all] [--repeat R] [SWEEP ARGS]
# cpu (default): the zoo's CPU BERT and GPT-Neo on 1-2 gloo ranks (how long: README.md's table of commands);
# paper: BERT-1B (and GPT-Neo-1.3B) on 1 and 8 GPUs, fp16, as in the artifact; tiny: a
# one-minute trial of the flow on the tiny BERT (--model bert).
# Results: ${RESULTS_DIR:-<repo>/results}/ablation-<model>.tsv (paper: ablation-paper-<model>.tsv)
# with the chart beside it (.png/.pdf). Interrupted, the same command resumes; exit status as the
# sweep's (0 every run ok, 1 some runs failed, 2 usage/config error, 130 interrupted).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() { sed -n '5,8p' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2; exit 2; }
SCALE=cpu MODELS=all REPEAT=3
SWEEP_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --scale) SCALE="${2:-}"; shift 2 || usage ;;
    --model) MODELS="${2:-}"; shift 2 || usage ;;
    --repeat) REPEAT="${2:-}"; shift 2 || usage ;;
    -h|--help) usage ;;
    *) SWEEP_ARGS+=("$1"); shift ;;
  esac
done
case "$SCALE" in
  cpu) DEVICE=cpu PREFIX=ablation- ;;
  tiny) DEVICE=cpu PREFIX=ablation-tiny- ;;
  paper) DEVICE=cuda PREFIX=ablation-paper- ;;
  *) echo "ablation/run.sh: unknown scale '$SCALE' (cpu, paper or tiny)" >&2; exit 2 ;;
esac
if [[ "$MODELS" == all ]]; then  # every config of the scale
  MODELS="$(cd "$ROOT/ablation/configs" && ls "$SCALE"-*.cfg 2>/dev/null | sed "s/^$SCALE-//; s/\.cfg$//")"
fi
for m in $MODELS; do
  [[ -f "$ROOT/ablation/configs/$SCALE-$m.cfg" ]] || {
    echo "ablation/run.sh: no model '$m' at scale '$SCALE' (ablation/configs/$SCALE-*.cfg)" >&2
    exit 2; }
done
if [[ -z "${PYTHON:-}" && "${SKIP_SETUP:-0}" != 1 ]]; then
  bash "$ROOT/scripts/setup.sh"
fi
PY="${PYTHON:-$ROOT/.venv/bin/python}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT="${RESULTS_DIR:-$ROOT/results}"
mkdir -p "$OUT"
cd "$ROOT"
status=0
for m in $MODELS; do
  results="$OUT/$PREFIX$m.tsv"
  echo "ablation: $SCALE $m -> $results ($REPEAT interleaved rounds); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  start=$(date +%s)
  rc=0
  "$PY" -m end2end.sweep "ablation/configs/$SCALE-$m.cfg" --results "$results" \
    --device "$DEVICE" --repeat "$REPEAT" ${SWEEP_ARGS[@]+"${SWEEP_ARGS[@]}"} || rc=$?
  echo "ablation: $m: $(( $(date +%s) - start )) s; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  if [[ $rc -eq 2 || $rc -eq 130 ]]; then exit $rc; fi
  [[ $rc -eq 0 ]] || status=$rc
  "$PY" -m ablation.plot "$results" -o "${results%.tsv}" || status=$?
done
exit $status
