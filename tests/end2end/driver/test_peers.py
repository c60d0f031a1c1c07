"""The PyTorch peers in the one driver (issue 18): every model family of the zoo trains under
``fsdp``, ``slapo-fsdp`` and ``dtensor-tp`` on 2 gloo ranks, or the run is a ``fail`` row that
says why the family is not supported; ``slapo-fsdp --tp 2`` runs TP x FSDP; bf16 (FSDP2 mixed
precision) and HF gradient checkpointing run under the two baselines."""

from end2end.driver.bench import parse_args, run_bench
from end2end.models import build_model, count_parameters
from end2end.results.store import read_results
from slapo.testing import run_distributed

FAMILIES = ("bert", "roberta", "albert", "gpt2", "gpt-neo", "opt", "llama", "t5", "wideresnet")
PEERS = ("fsdp", "slapo-fsdp", "dtensor-tp")
NO_DTENSOR_PLAN = {"gpt2": "Conv1D", "albert": "shared layer", "wideresnet": "convolutional"}
COMMON = ["--batch-size", "4", "--steps", "1", "--warmup", "1", "--gemm-seconds", "0.02",
          "--peak-tflops", "1", "--device", "cpu"]


def _args(mode, family, results, *extra):
    seq = ["--seq-len", "1"] if family == "wideresnet" else ["--seq-len", "16"]
    dec = ["--dec-seq-len", "8"] if family == "t5" else []
    return parse_args(["--mode", mode, "--model", f"tiny/{family}", "--results", results,
                       *seq, *dec, *COMMON, *extra])


def _runs(results: str):
    codes = {}
    for family in FAMILIES:
        for mode in PEERS:
            codes[mode, family] = run_bench(_args(mode, family, results))
    codes["tp"] = run_bench(_args("slapo-fsdp", "gpt-neo", results, "--tp", "2"))
    for mode in ("fsdp", "dtensor-tp"):  # FSDP2 mixed precision, DTensor + HF checkpointing
        codes["bf16", mode] = run_bench(_args(mode, "gpt-neo", results, "--dtype", "bf16",
                                              "--ckpt", "1"))
    return codes


def test_every_family_trains_under_the_peers_or_says_why(tmp_path):
    results = str(tmp_path / "r.tsv")
    codes = run_distributed(_runs, 2, results, timeout=600)[0]
    rows = read_results(results).rows
    assert len(rows) == len(FAMILIES) * len(PEERS) + 3
    assert [(r.dtype, r.ckpt, r.status) for r in rows[-2:]] == [("bf16", "1", "ok")] * 2
    for row in rows:
        family = row.model.split("/")[1]
        key = (row.impl, family)
        if row.impl == "dtensor-tp" and family in NO_DTENSOR_PLAN:
            assert row.status == "fail" and codes[key] == 1, row
            assert f"does not support {family.replace('-', '_')}" in row.error
            assert NO_DTENSOR_PLAN[family] in row.error
            continue
        assert row.status == "ok" and row.thrpt > 0 and row.per_gpu_param > 0, row
        assert row.world == 2
        want = (2, 1) if row.impl == "dtensor-tp" or row.tp == 2 else (1, 2)
        assert (row.tp, row.dp) == want, row
    by = {(r.impl, r.model, r.tp): r for r in rows}
    for family in ("bert", "gpt-neo", "t5", "wideresnet"):  # each rank stores its shards only
        whole = count_parameters(build_model(f"tiny/{family}")) / 1e6
        for mode, tp, most in (("fsdp", 1, 0.51), ("slapo-fsdp", 1, 0.51), ("dtensor-tp", 2, 0.9)):
            if (mode, tp) == ("dtensor-tp", 2) and family == "wideresnet":
                continue
            row = by[mode, f"tiny/{family}", tp]
            assert 0.4 * whole < row.per_gpu_param < most * whole, (row, whole)
    assert codes["tp"] == 0
