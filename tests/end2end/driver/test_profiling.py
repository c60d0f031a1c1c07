"""end2end.bench --profile: one extra, untimed step profiled per rank; end2end.profiling compares
runs op by op; warm-up (compile) time is reported apart from the timed steps."""

import json

import pytest

from end2end.driver.bench import parse_args, run_bench
from end2end.driver.profiling import compare_profiles, main
from end2end.results.store import read_results, twin_path
from slapo.testing import run_distributed

COMMON = ["--model", "tiny/bert", "--seq-len", "16", "--batch-size", "4", "--steps", "2",
          "--warmup", "2", "--gemm-seconds", "0.05", "--device", "cpu"]


def _profiled(results, out):
    return [run_bench(parse_args(["--mode", mode, "--results", results, "--profile", out,
                                  *COMMON])) for mode in ("eager", "slapo-megatron")]


def test_profile_files_per_rank_and_the_comparison(tmp_path, capsys):
    results, out = tmp_path / "r.tsv", tmp_path / "prof"
    assert run_distributed(_profiled, 2, str(results), str(out), timeout=300) == [[0, 0]] * 2
    files = sorted(p.name for p in out.glob("*.json"))
    assert files == [f"{m}_tiny_bert_n=2_bs=4_ckpt=0.rank{r}.json"
                     for m in ("eager", "slapo-megatron") for r in (0, 1)]
    eager = json.loads((out / files[0]).read_text())
    assert eager["rank"] == 0 and eager["ops"]["aten::addmm"]["cpu_us"] > 0
    assert (out / files[0].replace(".json", ".txt")).read_text().count("aten::") > 5
    assert [row.status for row in read_results(results).rows] == ["ok", "ok"]
    records = [json.loads(line) for line in twin_path(results).read_text().splitlines()]
    for extra in [r["extra"] for r in records if r["type"] == "row"]:
        assert len(extra["step_times"]) == 2  # the profiled step is not a timed one
        assert len(extra["warmup_times"]) == 2 and extra["build_seconds"] > 0
        assert extra["profile"].endswith(".rank0.json")
    table = compare_profiles([str(out / files[0]), str(out / files[2])], top=5)
    lines = table.splitlines()
    assert len(lines) == 7 and lines[-1].startswith("total")
    assert "_AllReduceIdentity" in table or "c10d::allreduce_" in table  # TP's syncs show
    assert main([str(out / files[0]), "--top", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5


def test_a_file_that_is_not_a_profile_is_one_clear_error(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text('{"rows": []}')
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: not a profile written by end2end.bench --profile" in err
    assert "Traceback" not in err
    with pytest.raises(Exception, match="not a profile"):
        compare_profiles([str(tmp_path / "missing.json")])
