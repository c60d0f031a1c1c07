"""Pipeline runs of the benchmark driver (end2end/driver/bench.py --pp,
end2end/driver/pipeline_plan.py): even
cuts, the layout and micro-batches, unsupported modes refused with what to use instead, and one
2-rank gloo spawn where ``slapo`` and ``slapo-deepspeed`` train a 2-stage tiny BERT / OPT and
write ``ok`` rows while ``eager --pp 2`` and ALBERT's shared layers end as ``fail`` rows."""

import math

import pytest

from end2end.driver.bench import parse_args, run_bench, spec_from_args
from end2end.spec.layout import Layout, run_layout
from end2end.spec.config_file import expand, load_runs, parse_lines
from end2end.models import build_model, count_parameters, get_model_spec
from end2end.driver.pipeline_plan import (check_pipeline_mode, default_micro_batch, even_cuts,
                                   layer_stacks, pipeline_knobs, stage_cuts)
from end2end.results.store import read_results
from slapo.errors import ConfigError
from slapo.testing import run_distributed

from tests.end2end.spec.test_config_file import CONFIGS

COMMON = ["--seq-len", "16", "--batch-size", "4", "--steps", "2", "--warmup", "1",
          "--gemm-seconds", "0.05", "--device", "cpu"]


# ---------------------------------------------------------------------- cut points
def test_even_cuts_examples():
    assert even_cuts(4, 2) == [1]
    assert even_cuts(24, 4) == [5, 11, 17]
    assert even_cuts(5, 2) == [2]  # the first stage takes the extra layer
    assert even_cuts(7, 3) == [2, 4]  # stages of 3, 2, 2
    assert even_cuts(3, 1) == [] and even_cuts(3, 3) == [0, 1]


@pytest.mark.parametrize("layers", range(1, 13))
def test_even_cuts_give_contiguous_balanced_stages(layers):
    for stages in range(1, layers + 1):
        cuts = even_cuts(layers, stages)
        bounds = [-1, *cuts, layers - 1]
        sizes = [b - a for a, b in zip(bounds, bounds[1:])]
        assert len(sizes) == stages and sum(sizes) == layers
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)


def test_even_cuts_errors():
    with pytest.raises(ConfigError, match=r"only 2 layer\(s\).*Hint: use at most 2 stages"):
        even_cuts(2, 3)
    with pytest.raises(ConfigError, match="cannot split"):
        even_cuts(4, 0)


def test_stage_cuts_over_several_stacks():
    assert stage_cuts([4], 2) == [1]
    assert stage_cuts([2, 2], 2) == [[1], []]  # T5: encoder | decoder
    assert stage_cuts([3, 3], 3) == [[1], [0]]
    # WRN-2.4B: 66 blocks -> stages of 17, 17, 16, 16; cuts after blocks 16, 33, 49 (all in layer3)
    assert stage_cuts([6, 8, 46, 6], 4) == [[], [], [2, 19, 35], []]
    assert layer_stacks(get_model_spec("t5-3b")) == [24, 24]
    assert layer_stacks(get_model_spec("wideresnet-2.4B")) == [6, 8, 46, 6]
    assert layer_stacks(get_model_spec("bert-xlarge")) == [24]
    knobs = pipeline_knobs(get_model_spec("cpu/bert"), 2, {"input_ids": None})
    assert knobs == {"pipeline_cuts": [1], "example_inputs": {"input_ids": None}}


def test_default_micro_batch():
    assert default_micro_batch(4, 2) == 2  # pp micro-batches when they divide
    assert default_micro_batch(3, 2) == 3  # else the whole batch
    assert default_micro_batch(4, 1) == 4


# ---------------------------------------------------------------------- layout, modes
def _layout_of(mode, n, *extra):
    args = parse_args(["--mode", mode, "--model", "tiny/bert", "--results", "x.tsv",
                       *COMMON, *extra])
    return run_layout(spec_from_args(args, n))


def test_pipeline_layout_and_micro_batches():
    assert _layout_of("slapo", 2, "--pp", "2") == Layout(
        tp=1, pp=2, dp=1, local_batch=4, micro_batch_size=2, num_microbatches=2)
    assert _layout_of("slapo-deepspeed", 2, "--pp", "2", "--micro-batch-size", "1"
                      ).num_microbatches == 4
    lay = _layout_of("slapo", 8, "--tp", "2", "--pp", "2", "--batch-size", "8")
    assert (lay.tp, lay.pp, lay.dp, lay.local_batch) == (2, 2, 2, 4)
    with pytest.raises(ConfigError, match="batch 4 is not a multiple of micro_batch 3"):
        _layout_of("slapo", 2, "--pp", "2", "--micro-batch-size", "3")
    # without a pipeline, micro-batches are gradient accumulation, in every mode
    for mode in ("slapo", "eager", "fsdp", "deepspeed", "dtensor-tp"):
        lay = _layout_of(mode, 2, "--micro-batch-size", "1")
        assert (lay.micro_batch_size, lay.num_microbatches) == (1, lay.local_batch) != (1, 1)


@pytest.mark.parametrize("mode,instead", [
    ("eager", "use mode 'slapo'"), ("deepspeed", "use mode 'slapo-deepspeed'"),
    ("megatron", "use mode 'slapo' .* or 'slapo-deepspeed'"),
    ("slapo-megatron", "use mode 'slapo' .* or 'slapo-deepspeed'"),
])
def test_modes_without_pipelines_say_what_to_use(mode, instead):
    with pytest.raises(ConfigError, match=rf"--pp 2: pipeline parallelism is not available in "
                                          rf"mode '{mode}'.*Hint: {instead}"):
        _layout_of(mode, 2, "--pp", "2")
    check_pipeline_mode(mode, 1)  # pp=1: fine
    check_pipeline_mode("slapo", 4)


def test_config_pragma_sets_pp_and_cli_passes_it():
    (spec,) = expand(parse_lines(["#@ pp=2 micro_batch=1", "slapo tiny/opt 2 16 0 4 0"]))
    assert spec.parallel_sizes == (1, 2, 1)
    assert spec.cli_args()[-4:] == ["--pp", "2", "--micro-batch-size", "1"]
    runs = load_runs(CONFIGS / "cpu_pipeline.cfg")
    assert {r.mode for r in runs if (r.pp or 1) > 1} == {"slapo", "slapo-deepspeed"}


# ---------------------------------------------------------------------- on 2 ranks
def _runs(results: str):
    codes = {}
    for mode, model in (("slapo", "tiny/bert"), ("slapo-deepspeed", "tiny/opt"),
                        ("eager", "tiny/bert"), ("slapo", "tiny/albert")):
        args = parse_args(["--mode", mode, "--model", model, "--pp", "2", "--ckpt", "0",
                           "--results", results, *COMMON])
        codes[f"{mode} {model}"] = run_bench(args)
    return codes


def test_two_stage_pipelines_write_ok_rows_and_unsupported_runs_fail_rows(tmp_path):
    results = tmp_path / "r.tsv"
    codes = run_distributed(_runs, 2, str(results), timeout=400)
    assert codes[0] == {"slapo tiny/bert": 0, "slapo-deepspeed tiny/opt": 0,
                        "eager tiny/bert": 1, "slapo tiny/albert": 1}
    res = read_results(results)
    assert not res.warnings
    # one row per run; ranks are not synchronised between runs of one process, so a rank that
    # finished early may write the next run's (fail) row first
    by_run = {(r.impl, r.model): r for r in res.rows}
    assert len(res.rows) == 4 and set(by_run) == {("slapo", "tiny/bert"),
                                                  ("slapo-deepspeed", "tiny/opt"),
                                                  ("eager", "tiny/bert"), ("slapo", "tiny/albert")}
    rows = [by_run[k] for k in (("slapo", "tiny/bert"), ("slapo-deepspeed", "tiny/opt"),
                                ("eager", "tiny/bert"), ("slapo", "tiny/albert"))]
    twins = {(t["Impl"], t["Model"]): t for t in _twin(results) if "Impl" in t}
    for row in rows[:2]:
        assert row.status == "ok" and row.error == "", row
        assert (row.world, row.tp, row.pp, row.dp) == (2, 1, 2, 1)
        assert row.thrpt > 0 and row.per_gpu_mem > 0 and row.per_gpu_tflops > 0
        assert 0 < row.mfu < 10 and math.isclose(row.thrpt, 4 / row.step_time, rel_tol=1e-4)
        # each rank stores one stage: less than the whole model (tied weights counted per stage)
        whole = count_parameters(build_model(row.model)) / 1e6
        assert 0.3 * whole < row.per_gpu_param < 0.9 * whole
        extra = twins[(row.impl, row.model)]["extra"]
        assert (extra["microbatches"], extra["micro_batch"]) == (2, 2)
        assert all(math.isfinite(x) for x in extra["losses"]) and len(extra["losses"]) == 3
    eager, albert = rows[2], rows[3]
    assert eager.status == "fail" and eager.thrpt is None
    assert "not available in mode 'eager'" in eager.error and "use mode 'slapo'" in eager.error
    assert albert.status == "fail" and "pipeline cuts are not supported for albert" in albert.error


def _twin(results):
    import json

    path = results.with_suffix(".jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
