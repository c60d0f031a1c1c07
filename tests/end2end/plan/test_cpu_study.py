"""The planner measured on this CPU (``python -m end2end.plan.cpu_study``, issue 40 item 4): a
tiny study measured for real on 2 gloo ranks, the study answered from the committed Figure 10
grid, the limits it plans within, and its one-line errors."""

import json
from pathlib import Path

import pytest

from end2end.plan.cluster import parse_cluster
from end2end.plan.cpu_study import DEFAULT_CALIBRATION, main
from end2end.plan.limits import SpaceLimits, accepted_ckpt
from end2end.plan.measured import candidate_key, grid_parts
from end2end.plan.space import enumerate_space
from end2end.results.store import read_results, twin_path
from end2end.spec.config_file import load_runs, parse_config

ROOT = Path(__file__).resolve().parents[3]
FIG10 = ROOT / "docs" / "results" / "reproduce-full" / "autotune" / "autotune-bert.tsv"


def _study(tmp_path: Path, *args: str) -> int:
    return main([*args, "--out", str(tmp_path / "study"), "--cache", str(tmp_path / "cache"),
                 "--calibration", str(DEFAULT_CALIBRATION)])


def _candidates(summary: dict) -> dict:
    return {c["line"]: c for c in summary["candidates"]}


def test_the_limits_give_the_figure_10_space_and_the_cap_prunes():
    cluster = parse_cluster("cpu:2x1", str(DEFAULT_CALIBRATION))
    limits = SpaceLimits(ckpt=("0", "0.25", "0.50", "1"), tp=(2,), accumulation=(1,))
    space = enumerate_space("cpu/bert", cluster, 256, 12, "fp32", modes=("slapo-megatron",),
                            limits=limits)
    assert {(c.tp, c.micro, c.accumulation) for c in space.candidates} == {(2, 12, 1)}
    assert [c.ckpt for c in space.candidates] == ["0", "0.25", "0.5", "1"]  # 12: no power of 2
    assert accepted_ckpt("megatron", "0.5") is None and accepted_ckpt("fsdp", "1") == "1"
    assert accepted_ckpt("slapo", "op") == "op" and accepted_ckpt("slapo", "1.5") is None
    tiny = cluster.with_budget(0.001)  # 1 MB per rank: the memory lower bound prunes all
    assert not enumerate_space("cpu/bert", tiny, 256, 12, "fp32", modes=("slapo-megatron",),
                               limits=limits).candidates
    assert tiny.capacity_bytes == 1e6 and cluster.capacity_bytes == cluster.memory_bytes


def test_candidates_that_differ_only_in_micro_batch_go_to_different_parts():
    cluster = parse_cluster("cpu:2x1", str(DEFAULT_CALIBRATION))
    grid = enumerate_space("tiny/llama", cluster, 32, 8, "fp32", modes=("slapo-megatron",),
                           limits=SpaceLimits(ckpt=("0",), tp=(2,), knobs=("",))).candidates
    assert sorted(c.micro for c in grid) == [1, 2, 4, 8]  # one results key, four runs
    parts = grid_parts(grid)
    assert [len(p) for p in parts] == [1, 1, 1, 1]
    for part in parts:
        assert len({candidate_key(c) for c in part}) == len(part)
    # with the recipe's sequence parallelism too: two keys (the knobs are part of it)
    both = enumerate_space("tiny/llama", cluster, 32, 8, "fp32", modes=("slapo-megatron",),
                           limits=SpaceLimits(ckpt=("0",), tp=(2,))).candidates
    assert sorted(c.knobs for c in both) == [""] * 4 + ["sequence_parallel=True"] * 4
    assert [len(p) for p in grid_parts(both)] == [2, 2, 2, 2]


def test_a_tiny_study_is_measured_for_real_and_its_report_follows_from_the_rows(tmp_path):
    assert _study(tmp_path, "tiny/llama", "--seq", "32", "--global-batch", "4", "--modes",
                  "slapo-megatron", "--tp", "2", "--accumulation", "1", "2", "--ckpt", "0", "1",
                  "--memory-gb", "8", "--repeat", "1", "--steps", "1", "--warmup", "1",
                  "--top", "1") == 0
    out = tmp_path / "study"
    summary = json.loads((out / "study.json").read_text())
    grid = parse_config(out / "grid.cfg")
    assert len(grid) == summary["grid"] == 4  # micro 4 and 2, CKPT 0 and 1
    by_line = _candidates(summary)
    assert all(c["status"] != "unmeasured" for c in by_line.values())  # measured or reported
    # every run's row, read back here, gives the report's numbers
    for k in (1, 2):  # micro 4 and micro 2 share results keys: two parts
        results = out / f"measured-{k}.tsv"
        specs = {s.key[:-1]: s for s in load_runs(out / f"part-{k}.cfg")}
        rows = read_results(results).rows
        assert {r.key[:-1] for r in rows} == set(specs)
        extras = [json.loads(x)["extra"] for x in twin_path(results).read_text().splitlines()
                  if '"row"' in x]
        assert all(e["mem_budget_gb"] == 8.0 for e in extras)  # the cap reached the driver
        for row, micro in zip(rows, [e.get("micro_batch") for e in extras]):
            spec = specs[row.key[:-1]]
            if row.status == "ok":  # the driver ran the candidate's micro-batch
                assert micro == spec.micro_batch
            entry = next(c for line, c in by_line.items()
                         if f"micro_batch={spec.micro_batch}" in line
                         and line.endswith(f" {spec.ckpt}"))
            assert entry["status"] == row.status and entry["rounds"] == 1
            assert entry["thrpt"] == pytest.approx(row.thrpt if row.status == "ok" else 0.0)
    ok = [c for c in by_line.values() if c["status"] == "ok"]
    assert ok, "no run of the tiny grid was measured ok"
    best = max(ok, key=lambda c: c["thrpt"])
    assert summary["best_grid"]["line"] == best["line"]
    (pick,) = summary["picks"]
    assert pick["line"] in by_line and pick["rank"] == 1  # the planner's best is in the grid
    assert summary["share"] == pytest.approx(1 / 4) and summary["share_met"]
    if pick["status"] == "ok":
        assert summary["ratio"] == pytest.approx(pick["thrpt"] / best["thrpt"])
    text = (out / "study.md").read_text()
    assert f"{summary['ratio']:.3f}" in text and "25.0% (goal <= 25%: met)" in text
    planned = [json.loads(x) for x in (out / "planned.jsonl").read_text().splitlines()]
    assert planned[0]["line"] == pick["line"] and planned[0]["Rank"] == 1


def test_the_study_answers_from_the_committed_figure_10_grid(tmp_path, capsys):
    assert _study(tmp_path, "cpu/bert", "--seq", "256", "--global-batch", "8", "16",
                  "--modes", "slapo-megatron", "--tp", "2", "--accumulation", "1", "2",
                  "--ckpt", "0", "1", "--memory-gb", "1.0", "--max-candidates", "2",
                  "--measured", str(FIG10)) == 0
    out = tmp_path / "study"
    assert not list(out.glob("measured-*.tsv"))  # nothing measured
    summary = json.loads((out / "study.json").read_text())
    assert summary["grid"] == 8  # micro = batch (the grid's) and batch / 2 (not in the file)
    rows = {(r.batch, r.ckpt): r for r in read_results(FIG10).rows}
    measured = [c for c in summary["candidates"] if c["status"] != "unmeasured"]
    assert len(measured) == 4 and summary["unmeasured"] == 4
    for c in measured:
        batch, ckpt = int(c["line"].split()[-2]), c["line"].split()[-1]
        assert f"micro_batch={batch}" in c["line"]  # the file's runs: no accumulation
        row = rows[(batch, ckpt)]
        if row.status == "oom":
            assert c["status"] == "oom"
        elif row.per_gpu_mem > 1.0:  # over the cap given here: judged out of memory
            assert c["status"] == "oom" and c["thrpt"] == pytest.approx(row.thrpt)
        else:
            assert c["status"] == "ok" and c["thrpt"] == pytest.approx(row.thrpt)
    status = {(int(c["line"].split()[-2]), c["line"].split()[-1]): c["status"] for c in measured}
    assert status == {(8, "0"): "ok", (8, "1"): "ok", (16, "0"): "oom", (16, "1"): "oom"}
    text = capsys.readouterr().out
    assert "unmeasured" in text and "Measurements the planner needs" in text
    assert (out / "study.cmd").read_text().startswith("python -m end2end.plan.cpu_study cpu/bert")


@pytest.mark.parametrize("args, words", [
    (["cpu/bert", "--cluster", "h100-80gb:8x1"], "measures on this CPU"),
    (["cpu/bert", "--cluster", "cpu:2x2"], "measures on this CPU"),
    (["cpu/bertt"], "unknown model"),
    (["cpu/bert", "--modes", "slapo-auto"], "not a mode the planner searches"),
    (["cpu/bert", "--modes", "megatron", "--ckpt", "0.5"], "no mode searched takes it"),
    (["tiny/llama", "--measured", str(FIG10)], "holds no row of tiny/llama"),
    (["cpu/bert", "--seq", "128", "--measured", str(FIG10)], "holds no row of cpu/bert at seq 128"),
    (["cpu/bert", "--measured", "no-such.tsv"], "no such results file"),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, words):
    assert _study(tmp_path, *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "study").exists()


def test_a_missing_calibration_is_one_line(tmp_path, capsys):
    assert main(["cpu/bert", "--out", str(tmp_path), "--calibration", "nope.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.json: no such file" in err[0]


def test_every_option_is_documented_with_its_default():
    from end2end.plan.cpu_study import build_parser

    parser = build_parser()
    text = " ".join(parser.format_help().split())
    assert parser.prog == "python -m end2end.plan.cpu_study"
    for action in parser._actions:
        assert action.help, action.dest
        if action.option_strings and action.nargs != 0 and action.default not in (None, (), ""):
            assert f"(default: {action.default})" in text, action.dest


def test_a_prediction_above_the_memory_cap_is_sim_oom():
    from end2end.models import get_model_spec
    from end2end.plan.predict import predict

    cluster = parse_cluster("cpu:2x1", str(DEFAULT_CALIBRATION))
    cand = enumerate_space("tiny/llama", cluster, 32, 4, "fp32",
                           modes=("slapo-megatron",)).candidates[0]
    values = dict(status="sim", step_time=0.1, per_gpu_mem=0.5,
                  extra=dict(needed_bytes=0.3e9, timing=[]))
    runs = [(get_model_spec("tiny/llama").layers // cand.pp, values)]
    assert predict(cand, runs, cluster).status == "sim"
    capped = predict(cand, runs, cluster.with_budget(0.4))  # PerGPUMem 0.5 GB > 0.4 GB
    assert capped.status == "sim-oom" and "budget 0.4 GB" in capped.error
    assert predict(cand, runs, cluster.with_budget(0.6)).status == "sim"
