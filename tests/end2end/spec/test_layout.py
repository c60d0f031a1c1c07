"""end2end.spec.layout: the frozen Layout of a run (ranks, replicas, stages, micro-batches), its
record in results files, and the RunSpec's JSON and dtypes (one table)."""

import dataclasses

import pytest
import torch

from end2end.spec.config_file import make_run_spec
from end2end.spec.layout import Layout, run_layout
from end2end.spec.runspec import DTYPES, RunSpec


def _spec(mode="slapo-deepspeed", n=16, batch=256, **options):
    return make_run_spec(mode, "tiny/gpt2", n, 64, 0, batch, "0", **options)


def test_layout_of_a_pipeline_and_its_ranks():
    lay = run_layout(_spec(tp=2, pp=2, micro_batch=4))
    assert lay == Layout(tp=2, pp=2, dp=4, local_batch=64, micro_batch_size=4,
                         num_microbatches=16)
    assert lay.stage_leaders() == [0, 8]
    assert [lay.replica(r) for r in (0, 1, 2, 7, 8, 9)] == [0, 0, 1, 3, 0, 0]
    assert [lay.stage(r) for r in (0, 7, 8, 15)] == [0, 0, 1, 1]
    short = lay.with_microbatches(3)
    assert (short.local_batch, short.num_microbatches, short.micro_batch_size) == (12, 3, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        lay.tp = 4


def test_layout_record_keeps_the_results_names_and_reads_back():
    lay = run_layout(_spec(tp=2, pp=2, micro_batch=4))
    record = lay.as_record()
    assert list(record) == ["tp", "pp", "dp", "local_batch", "micro_batch", "microbatches"]
    assert Layout.from_record(record) == lay
    with pytest.raises(ValueError, match=r"missing \['num_microbatches'\]"):
        Layout.from_record({k: v for k, v in record.items() if k != "microbatches"})


def test_runspec_json_round_trip_and_bad_input():
    spec = _spec(tp=2, pp=2, micro_batch=4, dtype="bf16", steps=3)
    assert RunSpec.from_json(spec.to_json()) == spec
    back = RunSpec.from_json(spec.to_json())
    assert (back.dtype, back.steps, back.micro_batch, back.tp) == ("bf16", 3, 4, 2)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['colour'\]"):
        RunSpec.from_json(spec.to_json()[:-1] + ', "colour": 1}')
    with pytest.raises(ValueError, match="missing"):
        RunSpec.from_json('{"mode": "eager"}')


def test_runspec_dtypes_come_from_one_table():
    assert set(DTYPES) == {"fp32", "fp16", "bf16"}
    assert _spec(dtype="fp16").torch_dtype is torch.float16
    assert _spec(dtype="bf16").low_precision_dtype is torch.bfloat16
    assert _spec(dtype="fp32").low_precision_dtype is None
    unset = _spec()
    assert unset.dtype is None and unset.torch_dtype is torch.float32
    assert unset.torch_dtype_name == "float32"
