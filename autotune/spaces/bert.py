"""BERT at CPU scale (``cpu/bert``: 4 layers, h=512) under Slapo-TP (``slapo-megatron``, 2 gloo
ranks), sequence 256: batch size x activation-checkpoint ratio (4 layers: ratio 0.25 = one
layer). A per-rank memory budget puts a real OOM region in the space (large batches with little
checkpointing); on CPU the OOM is this budget (``end2end.bench --mem-budget-gb``).

Calibration (2026-12-01, 2 shared cores, 1 warm-up + 1 step): peak memory per rank 0.60 GB at
batch 4 / ratio 0, 0.80 GB at 8 / 0.5, 1.16 GB at 16 / 1, 1.55 GB at 16 / 0; so 1.3 GB leaves
batch 16-20 with little checkpointing out. ``AUTOTUNE_RESULTS`` overrides the results file.

    python -m slapo.autotune --space autotune/spaces/bert.py --strategy search --budget 12 \\
        --db results/autotune-bert.db
"""

import os
import sys
from pathlib import Path

from slapo.autotune import Space

from autotune.driver import candidate_arguments, cpu_command

MODE, MODEL, GPUS, SEQ_LEN = "slapo-megatron", "cpu/bert", 2, 256
MEM_BUDGET_GB = 1.3
RESULTS = os.environ.get("AUTOTUNE_RESULTS", "results/autotune-bert.tsv")

space = Space("cpu-bert")
space.int("batch_size", 4, 20, step=4)
space.float("ckpt_ratio", 0.0, 1.0, step=0.25)

_RUN = candidate_arguments(MODE, MODEL, GPUS, SEQ_LEN)
command = cpu_command(_RUN, RESULTS, MEM_BUDGET_GB)
timeout = 300  # the tuner's limit; the driver stops the run (and writes its row) at 240 s

# the simulator's prediction of a candidate (``--prune-predicted-oom``, ``--rank-by-prediction``;
# autotune/README.md, "Pruning by the simulator"): the same run on fake tensors with the ``cpu``
# profile, against the same per-rank budget. The profile: AUTOTUNE_CPU_PROFILE, else the committed
# one of the machine that measured the grid when it exists, else the default cache
# (~/.cache/slapo/cpu_profile.json, measured on first use).
memory_budget_gb = MEM_BUDGET_GB
COMMITTED_PROFILE = Path(__file__).resolve().parents[2] / "docs" / "results" / "cpu_profile.json"
CPU_PROFILE = os.environ.get("AUTOTUNE_CPU_PROFILE") or (
    str(COMMITTED_PROFILE) if COMMITTED_PROFILE.is_file() else "")
predict = [sys.executable, "-m", "end2end.simulate.one", *_RUN, "--device", "cpu",
           "--mem-budget-gb", str(MEM_BUDGET_GB), "--timeout", "240"] + (
               ["--calibration", CPU_PROFILE] if CPU_PROFILE else [])
predict_timeout = 300
