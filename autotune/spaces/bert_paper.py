"""BERT-1B at the paper's scale (zoo ``bert-xlarge``: 24 layers, h=2048, 16 heads, FFN 4096) under
Slapo-TP (``slapo-megatron``, 8 GPUs, TP 8), sequence 512, fp16: the paper's Figure 10 grid,
batch size {8..28 step 2} x checkpoint ratio {0, 0.25, 0.34, 0.5, 0.67, 0.84, 0.92, 1}
(88 candidates; the paper's plot data has the same batches and every ratio but 0).

Ratios apply to round(24 x ratio) evenly spaced layers (24, 22, 20, 16, 12, 8, 6, 0 layers),
not the original's ``int(1/ratio)`` stride (which made 1-0.67 all checkpoint every layer, 0.5
and 0.34 every second, 0.25 every fourth: artifact notes §1.9).

``command`` is the real run on 8 GPUs (the benchmark driver under torchrun, 5 warm-up + 40
steps; a CUDA OOM is an ``oom`` row); ``predict`` is the simulator on ``v100-32gb``, the
paper's p3dn.24xlarge (``python -m end2end.simulate.one``: a candidate predicted over the
GPU's memory is ``sim-oom``). ``memory_budget_gb`` is the peak of live tensors a 32 GB V100
holds once the profile's stated allocator overhead and reserve are taken off (what the
simulator's own OOM verdict uses), so pruning by prediction agrees with it. Predict the whole
grid without a GPU (autotune/README.md, "Figure 10 at paper scale, predicted")::

    python -m autotune.predicted_grid --space autotune/spaces/bert_paper.py \\
        --predictions results/autotune-bert-paper.v100-32gb.predictions.jsonl --simulate

and on 8 GPUs, the search with the predicted OOMs pruned::

    python -m slapo.autotune --space autotune/spaces/bert_paper.py --strategy search \\
        --budget 12 --db results/autotune-bert-paper.db --prune-predicted-oom 0.1
"""

import os
import sys

from end2end.simulate.profiles import GB, get_profile

from slapo.autotune import Space

from autotune.driver import candidate_arguments

MODE, MODEL, GPUS, SEQ_LEN, DTYPE = "slapo-megatron", "bert-xlarge", 8, 512, "fp16"
DEVICE = "v100-32gb"
RESULTS = os.environ.get("AUTOTUNE_RESULTS", "results/autotune-bert-paper.tsv")

space = Space("paper-bert-1b")
space.int("batch_size", 8, 28, step=2)
space.choice("ckpt_ratio", [0, 0.25, 0.34, 0.5, 0.67, 0.84, 0.92, 1.0])

_RUN = candidate_arguments(MODE, MODEL, GPUS, SEQ_LEN, dtype=DTYPE)
command = [sys.executable, "-m", "autotune.driver", *_RUN, "--results", RESULTS,
           "--steps", "40", "--warmup", "5", "--timeout", "1800"]
timeout = 2000  # the tuner's limit; the driver stops the run (and writes its row) at 1800 s

_PROFILE = get_profile(DEVICE)
memory_budget_gb = round((_PROFILE.memory_bytes - _PROFILE.reserved_bytes)
                         / (1 + _PROFILE.allocator_overhead) / GB, 3)
predict = [sys.executable, "-m", "end2end.simulate.one", *_RUN, "--device", DEVICE,
           "--timeout", "600"]
predict_timeout = 660
