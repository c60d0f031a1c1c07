"""Figure 9: the step plan of every ablation config, the chart and table from a fixture results
file (medians, min-max, speedups, per-rank numbers, failures, refusals), and the tiny config run
for real through the sweep, writing every step's row."""

import dataclasses
import math
from pathlib import Path

import pytest

from ablation.plot import main as plot_main
from end2end.results.ablation import STEPS, AblationError, format_table, step_of, summarise
from end2end.spec.config_file import load_runs, make_run_spec
from end2end.results.store import ResultRow, append_result, read_results
from end2end.sweep.single_node import run_sweep

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "ablation" / "configs").glob("*.cfg"))


def test_there_are_configs_for_both_models_at_both_scales():
    names = {c.stem for c in CONFIGS}
    assert {"cpu-bert", "cpu-gpt-neo", "paper-bert", "paper-gpt-neo", "tiny-bert"} <= names


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.stem)
def test_every_config_is_the_five_steps_in_order(config):
    runs = load_runs(config)
    steps = [step_of(ResultRow.from_spec(spec, thrpt=1.0)) for spec in runs]
    assert steps == list(STEPS)
    assert len({r.model for r in runs}) == 1 and len({r.seq_len for r in runs}) == 1
    vanilla, kernel, attn_tp, emb_tp, ckpt = runs
    assert vanilla.n == kernel.n == 1 and attn_tp.n == emb_tp.n == ckpt.n > 1
    kernel_knobs = set(kernel.knobs.split(",")) - {""}
    assert set(attn_tp.knobs.split(",")) == kernel_knobs | {"shard_embedding=False"}
    assert set(emb_tp.knobs.split(",")) - {""} == set(ckpt.knobs.split(",")) - {""} == kernel_knobs
    if config.stem.startswith(("cpu", "tiny")):  # CPU: one batch, so samples/s compare
        assert len({r.batch_size for r in runs}) == 1


def test_rows_that_are_no_step_are_refused():
    for spec in (make_run_spec("deepspeed", "tiny/bert", 2, 16, 0, 4, "0"),
                 make_run_spec("slapo", "tiny/bert", 1, 16, 0, 4, "0.5"),
                 make_run_spec("slapo-megatron", "tiny/bert", 2, 16, 0, 4, "0.5",
                               knobs="shard_embedding=False")):
        with pytest.raises(AblationError, match="is no step of the ablation"):
            step_of(ResultRow.from_spec(spec, thrpt=1.0))


def _fixture(path: Path, thrpts, failed_step=None):
    """Rows of tiny-bert.cfg's runs, ``thrpts[step]`` per repeat (repeats interleaved)."""
    runs = load_runs(Path(__file__).resolve().parents[2] / "ablation/configs/tiny-bert.cfg")
    for r in range(len(thrpts[0])):
        for i, spec in enumerate(runs):
            spec = dataclasses.replace(spec, repeat=r)
            if i == failed_step:
                row = ResultRow.from_spec(spec, "oom", error="CUDA out of memory")
            else:
                row = ResultRow.from_spec(spec, thrpt=thrpts[i][r], device="cpu")
            append_result(path, row)


def test_table_and_figure_from_a_fixture(tmp_path, capsys):
    results = tmp_path / "ablation-tiny.tsv"
    thrpts = [[1.0, 1.2, 0.8], [2.0, 2.2, 2.1], [3.0, 3.3, 2.9], [3.9, 4.0, 4.2], [3.0, 3.1, 2.8]]
    _fixture(results, thrpts)
    steps = summarise(read_results(results).rows)
    assert [s.step for s in steps] == list(STEPS)
    assert [s.median for s in steps] == [1.0, 2.1, 3.0, 4.0, 3.0]
    assert steps[2].range == (2.9, 3.3) and steps[2].ranks == 2
    assert math.isclose(steps[3].per_rank(steps[3].median), 2.0)
    table = format_table(steps)
    assert "| + Embedding TP |" in table and "4.00x" in table and "2.10x" in table
    assert "`shard_embedding=False`" in table and "(2.9-3.3, 3x)" in table
    assert plot_main([str(results), "-o", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig.png").stat().st_size > 0 and (tmp_path / "fig.pdf").exists()
    assert "| Vanilla HF |" in capsys.readouterr().out


def test_a_failed_step_is_shown_not_dropped(tmp_path):
    results = tmp_path / "r.tsv"
    _fixture(results, [[1.0]] * 5, failed_step=4)
    steps = summarise(read_results(results).rows)
    assert steps[4].median is None and steps[4].failed == ["oom"]
    assert "| + Checkpointing |" in format_table(steps) and "| oom |" in format_table(steps)
    assert plot_main([str(results), "-o", str(tmp_path / "fig")]) == 0


def test_unlike_runs_are_refused(tmp_path, capsys):
    results = tmp_path / "r.tsv"
    _fixture(results, [[1.0]] * 5)
    other = make_run_spec("eager", "tiny/bert", 1, 16, 0, 8, "0")  # vanilla at another batch
    append_result(results, ResultRow.from_spec(other, thrpt=1.0))
    assert plot_main([str(results), "--table"]) == 2
    assert "two different runs for step 'Vanilla HF'" in capsys.readouterr().err
    append_result(tmp_path / "two.tsv", ResultRow.from_spec(
        make_run_spec("eager", "tiny/gpt2", 1, 16, 0, 4, "0"), thrpt=1.0))
    append_result(tmp_path / "two.tsv", ResultRow.from_spec(
        make_run_spec("eager", "tiny/bert", 1, 16, 0, 4, "0"), thrpt=1.0))
    assert plot_main([str(tmp_path / "two.tsv"), "--table"]) == 2
    assert "one ablation results file per model" in capsys.readouterr().err


def test_tiny_ablation_runs_every_step(tmp_path):
    """The tiny config through the real sweep (torchrun launches): one ok row per step."""
    config = Path(__file__).resolve().parents[2] / "ablation/configs/tiny-bert.cfg"
    results = tmp_path / "ablation-tiny-bert.tsv"
    run_sweep(str(config), str(results), max_devices=2, timeout=300)
    rows = read_results(results).rows
    assert [r.status for r in rows] == ["ok"] * 5, [r.error for r in rows]
    assert [step_of(r) for r in rows] == list(STEPS)
    assert plot_main([str(results), "-o", str(tmp_path / "fig")]) == 0


def test_a_results_file_that_cannot_be_read_is_one_line(tmp_path, capsys):
    missing = tmp_path / "nope.tsv"
    assert plot_main([str(missing), "--table"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err == f"ablation.plot: error: cannot read results '{missing}': No such file or " \
                  "directory.\n"
    headless = tmp_path / "x.tsv"
    headless.write_text("not\ta results file\n")
    assert plot_main([str(headless)]) == 2
    assert capsys.readouterr().err == f"ablation.plot: error: {headless}: no header line " \
                                      "starting with 'Impl'.\n"


def test_a_row_that_is_no_step_is_one_line_with_a_hint(tmp_path, capsys):
    results = tmp_path / "r.tsv"
    append_result(results, ResultRow.from_spec(
        make_run_spec("deepspeed", "tiny/bert", 2, 16, 0, 4, "0"), thrpt=1.0))
    assert plot_main([str(results)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ablation.plot: error: {results}: the run deepspeed n=2 ")
    assert err.endswith("is no step of the ablation. Hint: give the results file of one "
                        "ablation config (bash ablation/run.sh writes "
                        "results/ablation-<model>.tsv).\n")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_step_summary_by_hand(tmp_path):
    """Medians over vanilla's (1.0), and "~" where a step's range overlaps the previous one's:
    step 2's 1.9-2.3 overlaps step 1's 2.0-2.2; no other pair of neighbours does."""
    results = tmp_path / "r.tsv"
    _fixture(results, [[1.0, 1.2, 0.8], [2.0, 2.2, 2.1], [2.0, 2.3, 1.9], [3.9, 4.0, 4.2],
                       [3.0, 3.1, 2.8]])
    steps = summarise(read_results(results).rows)
    assert [s.median for s in steps] == [1.0, 2.1, 2.0, 4.0, 3.0]
    assert [s.vs_vanilla for s in steps] == [1.0, 2.1, 2.0, 4.0, 3.0]
    assert [s.within_noise for s in steps] == [False, False, True, False, False]
    assert [s.repeats for s in steps] == [3] * 5 and steps[2].range == (1.9, 2.3)
    assert "| 2 (1.9-2.3, 3x) | 1 | 2.00x |" in format_table(steps)  # step 2 on 2 ranks
