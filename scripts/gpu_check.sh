#!/usr/bin/env bash
# One-GPU check of the op library and the driver on one NVIDIA GPU (295 s on one H200 on
# 2026-12-04 with predictions put in its output first: docs/results/gpu_h200/check):
#   1. attention kernels (flash / efficient / cudnn / math) vs eager attention, bf16, fwd+bwd:
#      speed and error (scripts/gpu_attention_check.py -> attention.tsv);
#   2. single-GPU training, eager HF vs Slapo, bf16: BERT-large (also recomputing), GPT-Neo-1.3B
#      and OPT-1.3B, a few steps each (end2end/configs/gpu_check.cfg through the sweep and
#      end2end/driver/bench.py -> gpu_check.tsv), and one more step of each under the torch
#      profiler (-> profiles/: each op's and kernel's GPU time, for the simulator's per-op model);
#   3. each training line beside the simulator's h200 prediction of it (issue 25, item 8):
#      gpu_check.cfg is simulated for the `h200` profile on the CPU while step 1 runs on the GPU
#      (python -m end2end.simulate ... -> gpu_check.h200.sim.tsv, bounded by SIM_TIMEOUT seconds,
#      default 240, and finished before the measured sweep starts; predictions already in that
#      file are kept: the simulation is deterministic, so a file made on any machine at the same
#      commit can be put there first and only missing rows are simulated), and after the sweep
#      python -m end2end.simulate.compare prints measured vs predicted samples/s and memory with
#      their ratio (-> gpu_check_vs_h200.txt), and python -m end2end.simulate.gpu_busy the GPU's
#      busy and idle time of each profiled step beside the predicted step (-> gpu_busy.txt);
#   4. a figure of both (scripts/gpu_check_figure.py -> gpu_check.png/.pdf, or .svg without
#      matplotlib), plus env.txt.
#
#   bash scripts/gpu_check.sh [OUTDIR]        # OUTDIR: $OUT if set, else results/gpu_check
#
# Uses the python on PATH (or $PYTHON, or .venv when python3 has no torch) with its own torch (>= 2.11) and transformers (>= 5.17);
# nothing is installed or downloaded: the repository is put on PYTHONPATH. Exits 3 with a message
# when no GPU is usable.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-${1:-$ROOT/results/gpu_check}}"
PY="${PYTHON:-python3}"
if [[ -z "${PYTHON:-}" && -x "$ROOT/.venv/bin/python" ]] && ! python3 -c "import torch" 2>/dev/null
then PY="$ROOT/.venv/bin/python"; fi  # no torch on PATH: the repository's venv, if any
fail() { echo "gpu_check.sh: ERROR: $*" >&2; exit 3; }
command -v "$PY" >/dev/null 2>&1 || fail "no '$PY' interpreter on PATH (set PYTHON=...)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

why="$("$PY" - 2>&1 <<'PY'
import sys
try:
    import torch
except Exception as exc:
    print(f"torch cannot be imported ({type(exc).__name__}: {exc})"); sys.exit(1)
if not torch.cuda.is_available():
    print(f"no CUDA GPU is visible (torch {torch.__version__}, CUDA build "
          f"{torch.version.cuda or 'none'}, CUDA_VISIBLE_DEVICES="
          f"{__import__('os').environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"); sys.exit(1)
PY
)" || fail "${why:-the GPU check failed}; this script needs one NVIDIA GPU (run the CPU suite instead: bash end2end/run_all_single_node.sh end2end/configs/cpu.cfg)"

"$PY" - <<'PY' || fail "slapo or its dependencies cannot be imported from $ROOT (see above)"
import torch, transformers, slapo, end2end.bench  # noqa: F401
def ver(v): return tuple(int(x) for x in v.split("+")[0].split(".")[:2])
print(f"gpu_check.sh: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}")
if ver(torch.__version__) < (2, 11) or ver(transformers.__version__) < (5, 17):
    print("gpu_check.sh: WARNING: tested with torch >= 2.11 and transformers >= 5.17")
PY

mkdir -p "$OUT"
start=$(date +%s)
"$PY" "$ROOT/scripts/env_dump.py" --device cuda > "$OUT/env.txt"
SIM_TIMEOUT="${SIM_TIMEOUT:-240}"
echo "== h200 predictions of the training lines: simulated on the CPU during step 1 =="
(cd "$ROOT" && CUDA_VISIBLE_DEVICES="" timeout "$SIM_TIMEOUT" "$PY" -m end2end.simulate \
  end2end/configs/gpu_check.cfg --device h200 --results "$OUT/gpu_check.h200.sim.tsv" \
  --timeout "$SIM_TIMEOUT" >"$OUT/simulate.log" 2>&1) &
sim_pid=$!
echo "== 1/4 attention kernels (bf16) =="
timeout 180 "$PY" "$ROOT/scripts/gpu_attention_check.py" --out "$OUT" \
  || echo "gpu_check.sh: attention check failed or timed out (exit $?)" >&2
wait "$sim_pid" || echo "gpu_check.sh: the h200 simulation failed or took over" \
  "$SIM_TIMEOUT s (exit $?; see $OUT/simulate.log); its rows so far are kept" >&2
echo "== 2/4 eager vs slapo training, 1 GPU (bf16) =="
cd "$ROOT"
"$PY" -m end2end.sweep end2end/configs/gpu_check.cfg --results "$OUT/gpu_check.tsv" \
  --device cuda --max-devices 1 --timeout 150 --profile "$OUT/profiles" || true
echo "== 3/4 measured vs the h200 prediction =="
"$PY" -m end2end.simulate.compare "$OUT/gpu_check.tsv" "$OUT/gpu_check.h200.sim.tsv" \
  --profile h200 | tee "$OUT/gpu_check_vs_h200.txt" || true
"$PY" -m end2end.simulate.gpu_busy "$OUT/gpu_check.tsv" "$OUT/gpu_check.h200.sim.tsv" \
  --profiles "$OUT/profiles" | tee "$OUT/gpu_busy.txt" || true
echo "== 4/4 figure =="
"$PY" "$ROOT/scripts/gpu_check_figure.py" "$OUT" || true
"$PY" -m end2end.plot "$OUT/gpu_check.tsv" -o "$OUT/gpu_check-fig7" --title "1 GPU, bf16" \
  2>/dev/null || true
echo "gpu_check.sh: done in $(( $(date +%s) - start )) s; outputs in $OUT"
ls -l "$OUT"
