"""``--save-every N --resume DIR`` in the driver (end2end/driver/resume.py): on 2 ranks, a run of
each of ``slapo`` (TP), ``slapo-megatron`` (TP under megatron-core's runtime) and ``slapo-fsdp``
(FSDP2) saves its state every 2 steps; a second run resumed from step 2 trains only steps 3-4
and its losses are the uninterrupted run's, bit-exact; the row records that it was resumed. A
mode without a torch optimizer (a DeepSpeed engine) refuses the flags with a fail row."""

import json
import os

import pytest

from end2end.driver.bench import parse_args, run_bench
from slapo.testing import run_distributed

COMMON = ["--model", "tiny/bert", "--seq-len", "16", "--batch-size", "4", "--ckpt", "0",
          "--steps", "3", "--warmup", "1", "--gemm-seconds", "0.02", "--device", "cpu"]


MODES = ("slapo", "slapo-megatron", "slapo-fsdp")
SLOW = os.environ.get("SLAPO_SLOW_TESTS") == "1"


def _runs(tmp: str, modes, refuse: bool):
    results = os.path.join(tmp, "r.tsv")
    codes = []
    for mode in modes:
        save = os.path.join(tmp, mode)
        codes.append(run_bench(parse_args(["--mode", mode, "--results", results, *COMMON,
                                           "--save-every", "2", "--save-dir", save])))
        codes.append(run_bench(parse_args(["--mode", mode, "--results", results, *COMMON,
                                           "--resume", os.path.join(save, "step-000002")])))
    if refuse:
        codes.append(run_bench(parse_args(["--mode", "slapo-deepspeed", "--results", results,
                                           *COMMON, "--resume", os.path.join(tmp, modes[0])])))
    return codes


def rows(path):
    return [json.loads(line) for line in open(path) if '"type": "row"' in line]


def check(tmp_path, modes, refuse: bool) -> None:
    codes = run_distributed(_runs, 2, str(tmp_path), modes, refuse, timeout=500)
    assert codes[0] == [0] * (2 * len(modes)) + [1] * refuse, codes
    runs = rows(tmp_path / "r.jsonl")
    for mode, full, resumed in zip(modes, runs[::2], runs[1::2]):
        assert full["Impl"] == resumed["Impl"] == mode, (full["Impl"], resumed["Impl"])
        losses, tail = full["extra"]["losses"], resumed["extra"]["losses"]
        assert len(losses) == 4 and tail == losses[2:], (mode, losses, tail)  # bit-exact
        assert losses[2] != losses[3], mode
        assert [os.path.basename(p) for p in full["extra"]["saved"]] == ["step-000002",
                                                                         "step-000004"]
        info = resumed["extra"]["resumed"]
        assert info["step"] == 2 and info["rng_restored"], (mode, info)
        assert info["from"].endswith("step-000002") and "resumed" not in full["extra"]
    if refuse:
        refused = runs[-1]
        assert refused["Status"] == "fail" and "--save-every/--resume" in refused["Error"]


def test_a_resumed_slapo_run_continues_bit_exact(tmp_path):
    check(tmp_path, MODES[:1], refuse=False)


@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason="3 modes + DeepSpeed: ~2 min on 2 shared cores; set "
                    "SLAPO_SLOW_TESTS=1")
def test_megatron_and_fsdp2_runs_resume_bit_exact_and_engines_refuse(tmp_path):
    check(tmp_path, MODES[1:], refuse=True)
