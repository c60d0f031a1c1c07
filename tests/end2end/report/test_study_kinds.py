"""The report kinds of the studies (``ablation``, ``grid``, ``seeds``) and of the paper comparison
(``paper``), each from a small committed-like file made here: the numbers come out of the file,
change with it, and a wrong argument is a one-line error."""

import json
from pathlib import Path

import pytest

from end2end.report.blocks import Block, ReportError
from end2end.report.generators import render
from end2end.results.store import ResultRow, append_result

ENV = {"time": "2026-12-01T10:00:00+00:00", "cpu_model": "Test CPU", "git_commit": "abc1234"}


def _block(text: str) -> Block:
    name, *args = text.split()
    return Block(path=Path("README.md"), line=1, name=name, args=tuple(args), body="",
                 span=(0, 1))


def _write(path: Path, rows):
    for row in rows:
        append_result(path, row, env=ENV)
    return path


def _row(impl, model, n, thrpt, repeat, status="ok", knobs="", device="cpu"):
    return ResultRow(impl=impl, model=model, seq=16, dec_seq=0, ngpu=n, batch=2, ckpt="0",
                     thrpt=thrpt, status=status, knobs=knobs, device=device, repeat=repeat,
                     tp=n if impl.endswith("megatron") else 1, git_commit="abc1234",
                     time=f"2026-12-01T10:0{repeat}:00")


def _figure7(path: Path, slapo_tp=(2.0, 2.2), device="cpu", status="ok") -> Path:
    rows = []
    for repeat in range(2):
        rows += [_row("megatron", "tiny/bert", 2, 1.0, repeat, status, device=device),
                 _row("slapo-megatron", "tiny/bert", 2, slapo_tp[repeat], repeat, status,
                      device=device),
                 _row("deepspeed", "tiny/bert", 2, 1.5, repeat, status, device=device),
                 _row("eager", "tiny/opt", 1, 1.0, repeat, status, device=device),
                 _row("slapo", "tiny/opt", 1, 0.8, repeat, status, device=device)]
    return _write(path, rows)


def test_paper_puts_the_best_ratio_beside_the_papers_and_moves_with_the_file(tmp_path):
    _figure7(tmp_path / "cpu.tsv")
    text = render(tmp_path, _block("paper --cpu cpu.tsv"))
    # best Slapo (Slapo-TP 2.1) / best baseline (DeepSpeed 1.5) on BERT: 1.40x, the max
    assert "| 2.92x | 1.40x (1.33-1.47) (`tiny/bert`, 2 ranks) | not yet simulated |" in text
    # 'best on every model' counts workloads of 2 or more ranks only: the 1-rank OPT is none
    assert "| ahead on 1 of 1 workloads of 2 or more ranks |" in text and "tiny/opt" not in text
    assert "2.10x over 1 workload (medians)" in text  # Slapo-TP / Megatron-LM
    assert "1.41x | not measurable here" in text
    _figure7(tmp_path / "faster.tsv", slapo_tp=(3.0, 3.3))
    assert "2.10x (2.00-2.20)" in render(tmp_path, _block("paper --cpu faster.tsv"))


def test_paper_marks_predictions_and_refuses_measured_rows_as_predictions(tmp_path):
    _figure7(tmp_path / "cpu.tsv")
    _figure7(tmp_path / "sim.tsv", slapo_tp=(3.0, 3.0), device="v100-32gb (simulated)",
             status="sim")
    text = render(tmp_path, _block("paper --cpu cpu.tsv --v100 sim.tsv"))
    assert "2.00x (2.00-2.00) (`tiny/bert`, 2 ranks) *(predicted)*" in text
    with pytest.raises(ReportError, match="holds measured rows where predictions"):
        render(tmp_path, _block("paper --cpu cpu.tsv --v100 cpu.tsv"))
    for bad, message in (("paper", "needs --cpu FILE"), ("paper --cpu", "FILE pairs"),
                         ("paper --cpu nope.tsv", "nope.tsv does not exist"),
                         ("paper --gpu cpu.tsv", "FILE pairs")):
        with pytest.raises(ReportError, match=message):
            render(tmp_path, _block(bad))


def test_ablation_renders_the_steps_from_the_file(tmp_path):
    rows = []
    for repeat, scale in enumerate((1.0, 1.1)):
        rows += [_row("eager", "tiny/bert", 1, 2.0 * scale, repeat),
                 _row("slapo-megatron", "tiny/bert", 1, 3.0 * scale, repeat),
                 _row("slapo-megatron", "tiny/bert", 2, 4.0 * scale, repeat,
                      knobs="shard_embedding=False")]
    _write(tmp_path / "ablation.tsv", rows)
    text = render(tmp_path, _block("ablation ablation.tsv"))
    assert "| Vanilla HF |" in text and "| + Kernel opt. |" in text
    assert "3.15 (3-3.3, 2x)" in text and "1.50x" in text and "2.00x" in text


@pytest.fixture(scope="module")
def grid_db(tmp_path_factory):
    from slapo.autotune import tune
    from slapo.autotune.cli import load_space_file

    def objective(v):  # the config line of each candidate, as autotune.driver reports it
        line = f"#@ steps=2\nslapo-megatron tiny/bert 2 64 0 {v['batch_size']} 0"
        if v["batch_size"] >= 16 and v["ckpt_ratio"] < 0.5:
            return {"status": "oom", "error": "out of memory", "config_line": line}
        return {"throughput": v["batch_size"] * (1.0 - 0.3 * v["ckpt_ratio"]),
                "config_line": line}

    root = tmp_path_factory.mktemp("grid")
    space = load_space_file("autotune/spaces/bert.py")["space"]
    tune(space, objective, strategy="grid", budget=100, db=str(root / "study.db"), study="grid")
    return root


def test_grid_draws_every_candidate_with_the_optimum_in_bold(grid_db):
    text = render(grid_db, _block("grid study.db"))
    assert text.splitlines()[0] == "| batch_size \\ ckpt_ratio | 0 | 0.25 | 0.5 | 0.75 | 1 |"
    assert "| 20 | oom | oom | **17** | 15.5 | 14 |" in text  # 20 x (1 - 0.15) = 17: the best
    assert "| 4 | 4 | 3.7 | 3.4 | 3.1 | 2.8 |" in text
    assert "the median over the grid study `grid`" in text
    with pytest.raises(ReportError, match="does not exist"):
        render(grid_db, _block("grid nope.db"))
    assert "**17**" in render(grid_db, _block("grid study.db grid"))  # the study named
    _figure7(grid_db / "cpu.tsv")
    text = render(grid_db, _block("paper --cpu cpu.tsv --grid study.db"))
    # the workload is the one the grid measured (its candidates' config lines), not a label
    assert "17 samples/s at batch_size 20, ckpt_ratio 0.5 (`tiny/bert`, 2 ranks; median of 1 " \
        "grid" in text and "| 17.25 samples/s at batch 18, ratio 0.25 *(plot data)* |" in text


def test_seeds_summarises_the_runs_of_the_file(tmp_path):
    runs = [dict(strategy="search", seed=0, evaluations=8, to_within=5, best_fraction=1.0)]
    runs += [dict(strategy="tpe", seed=s, evaluations=8, to_within=w, best_fraction=f)
             for s, (w, f) in enumerate([(3, 1.0), (None, 0.9), (7, 0.97)])]
    path = tmp_path / "seeds.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))
    text = render(tmp_path, _block("seeds seeds.jsonl"))
    assert "| tpe | 3 | 2 of 3 | 5 (3-7) | 0.970 (0.900-1.000) |" in text
    assert "TPE once per seed (3 seeds)" in text
    path.write_text("not json\n")
    with pytest.raises(ReportError, match="not the JSON lines"):
        render(tmp_path, _block("seeds seeds.jsonl"))


def test_provenance_names_every_command_of_a_multi_line_cmd_file(tmp_path):
    path = _figure7(tmp_path / "grid.tsv")
    path.with_suffix(".cmd").write_text(
        "bash autotune/run.sh\n\npython -m autotune.seeds  --db x\n")
    text = render(tmp_path, _block("provenance grid.tsv"))
    assert text.endswith("made by `bash autotune/run.sh`, then `python -m autotune.seeds --db x`.")


def test_paper_takes_the_max_over_multi_rank_workloads_only(tmp_path):
    """The paper's Figures 7 and 8 compare distributed systems: a 1-rank eager vs Slapo line,
    however fast, is not its single-node speedup."""
    _write(tmp_path / "one.tsv", [_row(impl, "tiny/gpt-neo", 1, thrpt, r) for r in range(2)
                                  for impl, thrpt in (("eager", 1.0), ("slapo", 4.0))])
    text = render(tmp_path, _block("paper --cpu one.tsv"))
    assert "| 2.92x | no multi-rank workload with both sides |" in text
    assert "| no workload of 2 or more ranks with both sides |" in text  # nor 'every model'


def test_paper_names_the_workloads_within_noise_and_marks_unconfirmed_values(tmp_path):
    _figure7(tmp_path / "cpu.tsv", slapo_tp=(1.4, 1.6))  # best Slapo 1.4-1.6 vs DeepSpeed 1.5
    text = render(tmp_path, _block("paper --cpu cpu.tsv"))
    assert "| ahead on 0 of 1 workloads of 2 or more ranks; within noise: `tiny/bert`, 2 " \
        "ranks 1.00x (0.93-1.07) ~ |" in text
    assert "| 1.02x-1.46x *(unconfirmed)* |" in text and "| 2.92x |" in text  # the abstract's
    assert "*(unconfirmed)*: not confirmed from a primary source" in text


def test_paper_has_figure_9s_row_from_the_measured_ablation(tmp_path):
    _figure7(tmp_path / "cpu.tsv")
    assert "| Progressive ablation (Figure 9), samples/s per step | every step faster than " \
        "the one before (a figure: no numbers given) | not given | not simulated |" in \
        render(tmp_path, _block("paper --cpu cpu.tsv"))
    rows = []
    for repeat in range(2):
        rows += [_row("eager", "tiny/bert", 1, 2.0, repeat),
                 _row("slapo-megatron", "tiny/bert", 1, 3.0, repeat),
                 _row("slapo-megatron", "tiny/bert", 2, 2.5, repeat,
                      knobs="shard_embedding=False")]
    _write(tmp_path / "ablation.tsv", rows)
    text = render(tmp_path, _block("paper --cpu cpu.tsv --ablation ablation.tsv"))
    assert "| 1 of 2 steps faster than the one before; `tiny/bert`: Vanilla HF 2 (n=1), " \
        "+ Kernel opt. 3 (1.50x) (n=1), + Attn/FFN TP 2.5 (1.25x) (n=2) (medians) |" in text


def test_a_grid_without_config_lines_names_no_workload(tmp_path):
    from slapo.autotune import Space, tune

    space = Space("g")
    space.choice("batch_size", [2, 4])
    tune(space, lambda v: float(v["batch_size"]), db=str(tmp_path / "s.db"), study="grid")
    _figure7(tmp_path / "cpu.tsv")
    assert "4 samples/s at batch_size 4 (workload not recorded; median of 1 grid study)" in \
        render(tmp_path, _block("paper --cpu cpu.tsv --grid s.db"))


def test_include_takes_a_generated_markdown_file_with_its_command(tmp_path):
    (tmp_path / "study.md").write_text("| a |\n|---|\n| 1 |\n")
    with pytest.raises(ReportError, match="with its .cmd beside it"):
        render(tmp_path, _block("include study.md"))
    (tmp_path / "study.cmd").write_text("python -m autotune.pruning --db x\n")
    text = render(tmp_path, _block("include study.md"))
    assert text == "| a |\n|---|\n| 1 |\n\nMade by `python -m autotune.pruning --db x`."
    # a text file goes in a fence; the .cmd's comment lines are notes after the command
    (tmp_path / "plan.txt").write_text("plan: x\n  1 slapo\n")
    (tmp_path / "plan.cmd").write_text("# run on a quiet machine\npython -m end2end.plan x\n")
    assert render(tmp_path, _block("include plan.txt")) == (
        "```text\nplan: x\n  1 slapo\n```\n\nMade by `python -m end2end.plan x`. run on a quiet "
        "machine")
    (tmp_path / "plan.json").write_text("{}")
    with pytest.raises(ReportError, match=".md or .txt"):
        render(tmp_path, _block("include plan.json"))


def test_simulated_rows_are_called_predictions_in_results_and_provenance(tmp_path):
    path = _figure7(tmp_path / "sim.tsv", device="v100-32gb (simulated)", status="sim")
    path.with_suffix(".cmd").write_text("python -m end2end.simulate c.cfg --device v100-32gb\n")
    assert render(tmp_path, _block("provenance sim.tsv")).startswith(
        "Simulated (predictions, not measurements) 2026-12-01")
    assert "Predicted samples/s" in render(tmp_path, _block("results sim.tsv"))
    measured = _figure7(tmp_path / "cpu.tsv")
    measured.with_suffix(".cmd").write_text("x\n")
    assert render(tmp_path, _block("provenance cpu.tsv")).startswith("Measured 2026-12-01")
