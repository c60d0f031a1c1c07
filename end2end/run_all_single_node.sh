#!/usr/bin/env bash
# Run every line of a benchmark config (the artifact's entry point), then plot Figure 7.
#   bash end2end/run_all_single_node.sh end2end/configs/cpu.cfg [--repeat R] [extra end2end.sweep args]
# --repeat R: R interleaved rounds (every line once, then every line again, ...: drift hits every
#   system alike); default 3 on CPU (shared, noisy machines), 1 on GPU; REPEAT=R sets it too.
#   The figure and the printed speedups use the median per (line, mode), with min-max ranges.
# 1. set-up (idempotent; SKIP_SETUP=1 skips it): scripts/setup.sh creates .venv with the pinned
#    stack on a fresh machine, PYTHON=... uses another interpreter instead;
# 2. the environment dump next to the results (<results>.env.txt);
# 3. the sweep (resumable: re-running continues where it stopped), 4. the figure.
# Results go to ${RESULTS:-<repo>/results/<config name>.tsv}; the figure to <results>-fig7.png/pdf
# (*_peers.cfg: <results>-peers.png/pdf, the peers figure); the speedups and a Markdown table of
# medians (min-max) are printed.
# Exit status: the sweep's (0 all ok, 1 some runs not ok, 2 usage/config error, 130 interrupted);
# the figure is drawn for 0 and 1 only.
# --check [--sim-device PROFILE]: instead of running, simulate every line for the config's device
#   (python -m end2end.simulate.check: the GPU its opening comment names, else this machine; or
#   PROFILE: v100-32gb a100-80gb h100-80gb h200 cpu) and list the runs predicted to fail or run
#   out of memory (rows in ${SIM_RESULTS:-results/<config>.<profile>.sim.tsv}); exit 0 when all are predicted to
#   fit, 1 otherwise (docs/simulate.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CFG="${1:?usage: run_all_single_node.sh CONFIG [sweep args]}"
shift
[[ -f "$CFG" ]] || { echo "run_all_single_node.sh: no config file '$CFG'" >&2; exit 2; }
CFG="$(cd "$(dirname "$CFG")" && pwd)/$(basename "$CFG")"   # paths are relative to the caller
NAME="$(basename "$CFG" .cfg)"
RESULTS="${RESULTS:-$ROOT/results/$NAME.tsv}"
[[ "$RESULTS" = /* ]] || RESULTS="$PWD/$RESULTS"
if [[ -z "${PYTHON:-}" && "${SKIP_SETUP:-0}" != 1 ]]; then
  bash "$ROOT/scripts/setup.sh"
fi
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$PY" ]] || PY="$(command -v python3)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
CHECK=0
SIM_DEVICE=()
ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --check) CHECK=1 ;;
    --sim-device) SIM_DEVICE=(--device "${2:?--sim-device needs a profile}"); shift ;;
    --sim-device=*) SIM_DEVICE=(--device "${1#--sim-device=}") ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
set -- ${ARGS[@]+"${ARGS[@]}"}
if [[ $CHECK -eq 1 ]]; then
  cd "$ROOT"
  [[ -n "${SIM_RESULTS:-}" ]] && SIM_DEVICE+=(--results "$SIM_RESULTS")
  exec "$PY" -m end2end.simulate.check "$CFG" ${SIM_DEVICE[@]+"${SIM_DEVICE[@]}"}
fi
DEVICE="${DEVICE:-$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}"
cd "$ROOT"
mkdir -p "$(dirname "$RESULTS")"
"$PY" scripts/env_dump.py --device "$DEVICE" | tee "${RESULTS%.tsv}.env.txt"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime)"
ROUNDS=()
plot=1
for arg in "$@"; do
  case "$arg" in
    --repeat|--repeat=*) REPEAT=given ;;
    --dry-run|--estimate|-h|--help) plot=0 ;;
  esac
done
if [[ "${REPEAT:-}" != given ]]; then
  ROUNDS=(--repeat "${REPEAT:-$([[ "$DEVICE" == cuda ]] && echo 1 || echo 3)}")
fi
start=$(date +%s)
rc=0
"$PY" -m end2end.sweep "$CFG" --results "$RESULTS" --device "$DEVICE" "${ROUNDS[@]}" "$@" || rc=$?
[[ $plot -eq 1 ]] || exit "$rc"
# sweep exit status: 0 all ok, 1 some runs not ok (still plotted: failures are marks),
# 2 usage/config error (e.g. an empty config), 130 interrupted -> no plot
if [[ $rc -ne 0 && $rc -ne 1 ]]; then
  echo "run_all_single_node.sh: the sweep exited $rc; no plot" >&2
  exit "$rc"
fi
echo "sweep: $(( $(date +%s) - start )) s; load average: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
DESC="$("$PY" -c 'import os, torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU, {len(os.sched_getaffinity(0))} cores")')"
FIGURE=(-o "${RESULTS%.tsv}-fig7")
[[ "$NAME" == *peers* ]] && FIGURE=(-o "${RESULTS%.tsv}-peers" --peers)   # configs/*_peers.cfg
"$PY" -m end2end.plot "$RESULTS" "${FIGURE[@]}" --table \
  --title "$(basename "$CFG") on $DESC: training samples/s (higher is better); labels: Slapo speedup over its baseline"
exit "$rc"
