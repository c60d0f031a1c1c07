"""Today's families (issue 27) in the one driver, on 2 gloo ranks: every tiny model of the zoo's
new families trains under ``eager`` (DDP), ``fsdp`` (FSDP2), ``hf-tp`` (transformers' own TP)
and ``slapo-auto`` (the "auto" schedule, also on LLaMA beside its hand recipe), and under
``slapo``, which runs a model's own recipe ("auto" for the families without a hand recipe); each
run is one ``ok`` row with the mode's layout and its parameters per rank, and a family without
a tensor-parallel plan is an ``hf-tp`` ``fail`` row that says why."""

import pytest

from end2end.driver.bench import parse_args, run_bench
from end2end.models import build_model, count_parameters, get_model_spec
from end2end.results.store import read_results
from slapo.testing import run_distributed

MODELS = ("qwen3", "mistral", "gemma3", "phi3", "mixtral", "qwen3-moe")
BASELINES = ("eager", "fsdp", "hf-tp")
COMMON = ["--batch-size", "4", "--seq-len", "16", "--steps", "1", "--warmup", "1",
          "--gemm-seconds", "0.02", "--peak-tflops", "1", "--device", "cpu"]


def _auto_registered() -> bool:
    from slapo.model_schedule import list_model_schedules

    return "auto" in list_model_schedules()


def _runs(results: str, slapo: bool) -> dict:
    runs = [(mode, model) for model in MODELS for mode in BASELINES]
    runs.append(("hf-tp", "gpt2"))  # no plan in its config: a fail row
    if slapo:
        runs += [("slapo-auto", model) for model in MODELS + ("llama",)]
        runs += [("slapo", "qwen3"), ("slapo", "llama")]
    return {(mode, model): run_bench(parse_args(["--mode", mode, "--model", f"tiny/{model}",
                                                 "--results", results, *COMMON]))
            for mode, model in runs}


def test_new_families_train_under_every_new_mode(tmp_path):
    results = str(tmp_path / "r.tsv")
    slapo = _auto_registered()
    codes = run_distributed(_runs, 2, results, slapo, timeout=900)[0]
    rows = read_results(results).rows
    assert len(rows) == len(codes)
    for row in rows:
        family = row.model.split("/")[1]
        key = (row.impl, family)
        if key == ("hf-tp", "gpt2"):
            assert row.status == "fail" and codes[key] == 1, row
            assert "has no base_model_tp_plan" in row.error, row.error
            continue
        assert row.status == "ok" and codes[key] == 0 and row.thrpt > 0, row
        tp_run = row.impl in ("hf-tp", "slapo-auto", "slapo")
        assert (row.world, row.tp, row.dp) == ((2, 2, 1) if tp_run else (2, 1, 2)), row
        whole = count_parameters(build_model(row.model, device="meta")) / 1e6
        assert row.per_gpu_param < (0.9 if row.impl != "eager" else 1.01) * whole, row
    if not slapo:
        pytest.skip("slapo.model_schedule has no 'auto' recipe yet: the slapo-auto and slapo "
                    "runs of these families were not made")


def test_the_new_families_name_auto_as_their_schedule():
    for model in MODELS:
        assert get_model_spec(f"tiny/{model}").schedule == "auto"
        assert get_model_spec(f"cpu/{model}").schedule == "auto"
    assert get_model_spec("tiny/llama").schedule == "llama"
