"""The tiny BERT (``tiny/bert``: 2 layers) under Slapo-TP (``slapo-megatron``, 2 gloo ranks),
sequence 64: batch size {4, 8} x checkpoint ratio {0, 0.5, 1} (6 candidates, about 15 s each).

The auto-tuning step of the quick reproduction (``bash scripts/reproduce.sh --quick``): the whole
flow of ``autotune/run.sh`` (grid, search and TPE replayed on it, the figure, the seeds) in a
couple of minutes; it checks that the flow runs, and measures nothing worth comparing
(``autotune/spaces/bert.py`` is the study). ``AUTOTUNE_RESULTS`` overrides the results file.

    SPACE=autotune/spaces/tiny_bert.py MODEL=tiny_bert bash autotune/run.sh
"""

import os

from slapo.autotune import Space

from autotune.driver import candidate_arguments, cpu_command

MODE, MODEL, GPUS, SEQ_LEN = "slapo-megatron", "tiny/bert", 2, 64
MEM_BUDGET_GB = 4.0  # no OOM region at this size: the budget only bounds a runaway
RESULTS = os.environ.get("AUTOTUNE_RESULTS", "results/autotune-tiny-bert.tsv")

space = Space("tiny-bert")
space.int("batch_size", 4, 8, step=4)
space.choice("ckpt_ratio", [0, 0.5, 1.0])

command = cpu_command(candidate_arguments(MODE, MODEL, GPUS, SEQ_LEN), RESULTS, MEM_BUDGET_GB)
timeout = 300  # the tuner's limit; the driver stops the run (and writes its row) at 240 s
