"""GPT-Neo at CPU scale (``cpu/gpt-neo``: 4 layers, h=512, local and global attention) under
Slapo-TP (``slapo-megatron``, 2 gloo ranks), sequence 512: batch size x activation-checkpoint
ratio (4 layers: ratio 0.25 = one layer), with a per-rank memory budget that puts a real OOM
region in the space (on CPU the OOM is this budget: ``end2end.bench --mem-budget-gb``).

Calibration (2026-12-01, 2 shared cores, 1 warm-up + 1 step): peak memory per rank 0.43 GB at
batch 2 / ratio 0, 0.77 GB at 8 / 1, 1.05 GB at 8 / 0; so 0.9 GB leaves batch 8-10 with little
checkpointing out. ``AUTOTUNE_RESULTS`` overrides the results file.

    python -m slapo.autotune --space autotune/spaces/gpt_neo.py --strategy tpe --budget 8 \\
        --db results/autotune-gpt-neo.db
"""

import os

from slapo.autotune import Space

from autotune.driver import candidate_arguments, cpu_command

MODE, MODEL, GPUS, SEQ_LEN = "slapo-megatron", "cpu/gpt-neo", 2, 512
MEM_BUDGET_GB = 0.9
RESULTS = os.environ.get("AUTOTUNE_RESULTS", "results/autotune-gpt-neo.tsv")

space = Space("cpu-gpt-neo")
space.int("batch_size", 2, 10, step=2)
space.float("ckpt_ratio", 0.0, 1.0, step=0.25)

_RUN = candidate_arguments(MODE, MODEL, GPUS, SEQ_LEN)
command = cpu_command(_RUN, RESULTS, MEM_BUDGET_GB)
timeout = 300  # the tuner's limit; the driver stops the run (and writes its row) at 240 s
