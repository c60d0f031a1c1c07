"""``--save-every N --resume DIR`` in the driver (end2end/driver/resume.py): a 2-rank Slapo-TP run
saves its state every 2 steps; a second run resumed from step 2 trains only steps 3-4 and its
losses are the uninterrupted run's, bit-exact; the row records that it was resumed. A mode
without a torch optimizer (a DeepSpeed engine) refuses the flags with a fail row."""

import json
import os

from end2end.driver.bench import parse_args, run_bench
from slapo.testing import run_distributed

COMMON = ["--model", "tiny/bert", "--seq-len", "16", "--batch-size", "4", "--ckpt", "0",
          "--steps", "3", "--warmup", "1", "--gemm-seconds", "0.02", "--device", "cpu"]


def _runs(tmp: str):
    results = os.path.join(tmp, "r.tsv")
    save = os.path.join(tmp, "states")
    codes = [run_bench(parse_args(["--mode", "slapo", "--results", results, *COMMON,
                                   "--save-every", "2", "--save-dir", save]))]
    codes.append(run_bench(parse_args(["--mode", "slapo", "--results", results, *COMMON,
                                       "--resume", os.path.join(save, "step-000002")])))
    codes.append(run_bench(parse_args(["--mode", "slapo-deepspeed", "--results", results,
                                       *COMMON, "--resume", save])))
    return codes


def rows(path):
    return [json.loads(line) for line in open(path) if '"type": "row"' in line]


def test_a_resumed_run_continues_bit_exact(tmp_path):
    codes = run_distributed(_runs, 2, str(tmp_path), timeout=400)
    assert codes[0] == [0, 0, 1], codes
    full, resumed, refused = rows(tmp_path / "r.jsonl")
    assert len(full["extra"]["losses"]) == 4 and len(resumed["extra"]["losses"]) == 2
    assert resumed["extra"]["losses"] == full["extra"]["losses"][2:]  # bit-exact
    assert full["extra"]["losses"][2] != full["extra"]["losses"][3]
    assert [os.path.basename(p) for p in full["extra"]["saved"]] == ["step-000002",
                                                                     "step-000004"]
    info = resumed["extra"]["resumed"]
    assert info["step"] == 2 and info["rng_restored"] and info["from"].endswith("step-000002")
    assert "resumed" not in full["extra"]
    assert refused["Status"] == "fail" and "--save-every/--resume" in refused["Error"]
