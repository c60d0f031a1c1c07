"""The planner end to end on a tiny model and a small cluster (the command, its table, the best
config line and launch command, --explain, --json), and the report on a synthetic plan."""

import json

from end2end.plan.__main__ import main
from end2end.plan.cluster import parse_cluster
from end2end.plan.predict import Prediction
from end2end.plan.report import best_lines, explain_lines, json_rows, table_lines
from end2end.plan.search import Evaluated, PlanResult
from end2end.plan.space import enumerate_space
from end2end.spec.config_file import expand, parse_lines

COLUMNS = {"Impl", "Model", "Seq", "nGPU", "Batch", "Ckpt", "Thrpt", "PerGPUMem", "MFU", "TP",
           "PP", "DP", "Dtype", "Status", "Device", "MicroBatch", "TokensPerGPU", "Phases",
           "line", "Rank"}


def test_a_tiny_model_on_two_nodes_is_planned_end_to_end(tmp_path, capsys):
    out_json = tmp_path / "plan.jsonl"
    assert main(["tiny/llama", "--cluster", "h100-80gb:1x2", "--seq", "64",
                 "--global-batch", "4", "--max-candidates", "2", "--cache", str(tmp_path),
                 "--json", str(out_json), "--explain", "1"]) == 0
    text = capsys.readouterr().out
    assert "plan: tiny/llama on h100-80gb:1x2 (2 devices), seq 64, global batch 4, bf16" in text
    assert "simulated 2 candidates" in text and "not simulated (budget, --max-candidates)" in text
    assert "samples/s" in text and "dominant cost" in text
    assert "note: the simulator prices the network for nodes of 8 devices" in text
    assert "config:\n  #@ dtype=bf16" in text and "--nnodes=2" in text  # one torchrun per node
    assert "--launcher slurm --slurm-nodes 2 --gpus-per-node 1" in text
    assert "#1 " in text and "step by phase:" in text
    rows = [json.loads(line) for line in out_json.read_text().splitlines()]
    assert len(rows) == 2 and COLUMNS <= set(rows[0])
    assert [r["Rank"] for r in rows] == [1, 2]
    fits = [r for r in rows if r["Status"] == "sim"]
    assert fits and fits[0]["Thrpt"] >= fits[-1]["Thrpt"] > 0
    for row in rows:  # the line is a config the driver expands to the same layout
        (spec,) = expand(parse_lines(row["line"].splitlines(), "plan"))
        assert spec.parallel_sizes == (row["TP"], row["PP"], row["DP"])
        assert (spec.mode, spec.batch_size, spec.ckpt) == (row["Impl"], 4, row["Ckpt"])


def _synthetic() -> PlanResult:
    cluster = parse_cluster("h100-80gb:8x1")
    space = enumerate_space("tiny/llama", cluster, 64, 16, "bf16")
    pick = {c.mode: c for c in space.candidates if c.mode in ("slapo-megatron", "megatron")}
    phases = dict(compute=0.8, recompute=0.0, communication=0.15, bubble=0.05)
    items = [Evaluated(pick["slapo-megatron"], {"total": 1.0}, 1.0,
                       Prediction("sim", "", 20.0, 0.8, 30.0, 34.0, 0.4, phases)),
             Evaluated(pick["megatron"], {"total": 1.0}, 1.0,
                       Prediction("sim", "", 16.0, 1.0, 35.0, 39.0, 0.3, phases))]
    return PlanResult("tiny/llama", cluster, 64, 16, "bf16", space, items, 0, 3, 2, 0, 1.0)


def test_the_best_is_shown_with_its_launch_command_and_beside_the_best_baseline():
    lines = "\n".join(best_lines(_synthetic()))
    assert "best: slapo-megatron" in lines and "(Slapo-TP)" in lines
    assert "torchrun --standalone --nproc_per_node=8 -m end2end.bench --mode slapo-megatron" \
        in lines
    assert "best baseline: megatron" in lines and "speedup 1.25x (predicted)" in lines


def test_the_table_rows_json_and_explain_agree():
    r = _synthetic()
    table = table_lines(r, 10)
    assert len(table) == 4 and table[2].split()[1] == "slapo-megatron"
    assert "compute 80%, communication 15%" in table[2]
    rows = json_rows(r)
    assert rows[0]["Thrpt"] == 20.0 and rows[0]["MarginGB"] == r.cluster.memory_bytes / 1e9 - 34
    assert rows[0]["TokensPerGPU"] == 20.0 * 64 / 8
    assert "the table has 2 rows" in explain_lines(r, 3)[0]
