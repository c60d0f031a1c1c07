"""The report kinds of the paper-scale predictions (``ablation-predicted``, ``grid-predicted``,
and ``paper``'s ``--tune-v100`` / ``--ablation-v100``), each from a small file made here: the
numbers come out of the file and change with it, measured rows are refused, and a wrong argument
is a one-line error."""

import json
from pathlib import Path

import pytest

from end2end.report.blocks import Block, ReportError
from end2end.report.generators import render
from end2end.report.predicted import PAPER_FIGURE10
from end2end.results.store import ResultRow, append_result

ENV = {"time": "2026-12-02T05:00:00+00:00", "cpu_model": "Test CPU", "git_commit": "abc1234"}
SIM = "v100-32gb (simulated)"


def _block(text: str) -> Block:
    name, *args = text.split()
    return Block(path=Path("README.md"), line=1, name=name, args=tuple(args), body="",
                 span=(0, 1))


def _step(impl, n, batch, thrpt, mem, status="sim", knobs="", ckpt="0", device=SIM):
    return ResultRow(impl=impl, model="bert-xlarge", seq=512, dec_seq=0, ngpu=n, batch=batch,
                     ckpt=ckpt, thrpt=thrpt, per_gpu_mem=mem, status=status, knobs=knobs,
                     device=device, dtype="fp16", tp=n if impl != "eager" else 1,
                     git_commit="abc1234", time="2026-12-02T05:00:00",
                     error="predicted 43.5 GB per rank > 32 GB" if status == "sim-oom" else "")


def _ablation(path: Path, kernel=23.1, device=SIM, status="sim") -> Path:
    rows = [_step("eager", 1, 12, 22.0, 13.4, device=device, status=status),
            _step("slapo-megatron", 1, 20, kernel, 20.0, device=device, status=status),
            _step("slapo-megatron", 8, 96, 77.5, 38.6, "sim-oom", device=device)]
    for row in rows:
        append_result(path, row, env=ENV)
    return path


def test_ablation_predicted_shows_each_step_and_never_a_speedup_for_an_oom(tmp_path):
    _ablation(tmp_path / "a.tsv")
    text = render(tmp_path, _block("ablation-predicted a.tsv"))
    assert "| Vanilla HF | `eager` bs=12 | 1 | sim | 22 | 22 | 1.00x | 13.4 |" in text
    assert "| + Kernel opt. | `slapo-megatron` bs=20 | 1 | sim | 23.1 | 23.1 | 1.05x | 20 |" \
        in text
    assert ("| + Embedding TP | `slapo-megatron` bs=96 | 8 | **sim-oom** | (77.5 if it fit) | - |"
            " - | 38.6 |") in text
    assert "1 of 3 steps are predicted not to run" in text and "43.5 GB per rank" in text
    _ablation(tmp_path / "b.tsv", kernel=33.0)
    assert "| 33 | 33 | 1.50x |" in render(tmp_path, _block("ablation-predicted b.tsv"))


def test_ablation_predicted_refuses_measured_rows_and_two_runs_of_a_step(tmp_path):
    _ablation(tmp_path / "cpu.tsv", device="cpu", status="ok")
    with pytest.raises(ReportError, match="holds measured rows"):
        render(tmp_path, _block("ablation-predicted cpu.tsv"))
    path = _ablation(tmp_path / "twice.tsv")
    append_result(path, _step("eager", 1, 16, 20.0, 15.0), env=ENV)
    with pytest.raises(ReportError, match="two rows for one step"):
        render(tmp_path, _block("ablation-predicted twice.tsv"))
    with pytest.raises(ReportError, match="does not exist"):
        render(tmp_path, _block("ablation-predicted nope.tsv"))


def _predictions(path: Path, scale: float = 1.0) -> Path:
    """Batches 18-26 x ratios 0/0.25/1: predicted OOM at batch 26 without checkpointing."""
    lines = []
    for b in (18, 22, 26):
        for r in (0, 0.25, 1.0):
            oom = b == 26 and r == 0
            lines.append({"params": {"batch_size": b, "ckpt_ratio": r}, "command": f"x {b} {r}",
                          "prediction": {"status": "sim-oom" if oom else "sim",
                                         "memory_gb": b * (1.2 - r), "error": "",
                                         "samples_per_s": scale * b * (1 - 0.4 * r)}})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_grid_predicted_marks_the_papers_optimum_and_oom_cells_beside_the_prediction(tmp_path):
    _predictions(tmp_path / "p.jsonl")
    text = render(tmp_path, _block("grid-predicted p.jsonl"))
    assert text.splitlines()[0] == "| batch_size \\ ckpt_ratio | 0 | 0.25 | 1 |"
    assert "| 18 | 18 | 16.2 ‡ | 10.8 |" in text  # ‡: the paper's optimum (18, 0.25)
    assert "| 22 | 22 | 19.8 † | 13.2 |" in text  # †: OOM in the paper (22, 0.25)
    assert "| 26 | sim-oom | **23.4** † | 15.6 |" in text  # the predicted optimum in bold
    assert "| optimum | 17.25 samples/s at batch 18, ratio 0.25 | 23.4 samples/s at batch 26, " \
        "ratio 0.25 |" in text
    assert "| samples/s over the grid | 11.5-17.25 | 10.8-23.4 |" in text
    # 16.2 / 10.8 at batch 18; the paper's 17.25 / 13.74
    assert "| ratio 0.25 over ratio 1 at batch 18 (6 of 24 layers checkpointed instead of 24, " \
        "in the paper and here) | 1.26x | 1.50x |" in text
    assert "| out of memory | 11 of 77 cells" in text and "| 1 of 9 candidates: 26/0 |" in text
    # predicted peak at the paper's OOM cells present here: (22, .25), (26, .25) -> 20.9, 24.7 GB
    assert ("| predicted peak per GPU at the paper's OOM cells | out of memory on a 32 GB V100 | "
            "20.9-24.7 GB |") in text
    assert "Made by" not in text
    (tmp_path / "p.cmd").write_text("python -m autotune.predicted_grid --space s.py\n")
    assert render(tmp_path, _block("grid-predicted p.jsonl")).endswith(
        "Made by `python -m autotune.predicted_grid --space s.py`.")
    _predictions(tmp_path / "q.jsonl", scale=2.0)
    assert "**46.8**" in render(tmp_path, _block("grid-predicted q.jsonl"))


def test_grid_predicted_draws_the_strategies_replayed_on_the_prediction(tmp_path):
    _predictions(tmp_path / "p.jsonl")
    runs = [dict(strategy="search", seed=0, evaluations=6, to_within=4, best_fraction=1.0),
            dict(strategy="tpe", seed=0, evaluations=8, to_within=None, best_fraction=0.9)]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    text = render(tmp_path, _block("grid-predicted p.jsonl --seeds s.jsonl"))
    assert "| search | 1 | 1 of 1 | 4 (4-4) | 1.000 (1.000-1.000) |" in text
    assert "| tpe | 1 | 0 of 1 | never | 0.900 (0.900-0.900) |" in text
    assert "TPE once per seed (1 seeds)" in text
    for bad, message in (("grid-predicted", "takes FILE"),
                         ("grid-predicted p.jsonl --json s.jsonl", "takes FILE"),
                         ("grid-predicted nope.jsonl", "does not exist")):
        with pytest.raises(ReportError, match=message):
            render(tmp_path, _block(bad))
    (tmp_path / "bad.jsonl").write_text("not json\n")
    with pytest.raises(ReportError, match="not a prediction line"):
        render(tmp_path, _block("grid-predicted bad.jsonl"))


def test_paper_rows_of_figures_9_and_10_come_from_the_predictions(tmp_path):
    cpu = tmp_path / "cpu.tsv"
    for r in range(2):
        for impl, thrpt in (("megatron", 1.0), ("slapo-megatron", 2.0)):
            append_result(cpu, ResultRow(impl=impl, model="tiny/bert", seq=16, dec_seq=0,
                                         ngpu=2, batch=2, ckpt="0", thrpt=thrpt, tp=2,
                                         device="cpu", repeat=r, git_commit="abc1234",
                                         time=f"2026-12-01T10:0{r}:00"), env=ENV)
    _predictions(tmp_path / "p.jsonl")
    _ablation(tmp_path / "a.tsv")
    text = render(tmp_path, _block("paper --cpu cpu.tsv --tune-v100 p.jsonl"))
    assert ("| 17.25 samples/s at batch 18, ratio 0.25 *(plot data)* | not given | 23.4 "
            "samples/s at batch_size 26, ckpt_ratio 0.25; 1 of 9 candidates predicted OOM "
            "*(predicted)* |") in text
    assert "| not given | not simulated |" in text.split("Progressive ablation")[1]  # no files
    text = render(tmp_path, _block("paper --cpu cpu.tsv --ablation-v100 a.tsv"))
    assert ("`bert-xlarge`: Vanilla HF 22 (n=1), + Kernel opt. 23.1 (1.05x) (n=1), "
            "+ Embedding TP sim-oom (n=8) *(predicted)*") in text
    assert "| Auto-tuning optimum (Figure 10) | 17.25 samples/s at batch 18, ratio 0.25 " \
        "*(plot data)* | not given | not simulated |" in text


def test_the_papers_figure_10_facts_are_its_plot_data():
    # 11 batches x 7 ratios; OOM: ratios 0.25-0.5 at batch 24-28, ratio 0.25 at 20-22
    assert len(PAPER_FIGURE10["batches"]) * len(PAPER_FIGURE10["ratios"]) == 77
    assert len(PAPER_FIGURE10["oom"]) == 11 and (18, 0.25) not in PAPER_FIGURE10["oom"]
    assert PAPER_FIGURE10["best"] == (18, 0.25, 17.25)
