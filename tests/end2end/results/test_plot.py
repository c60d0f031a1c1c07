"""Figure 7 plotting (end2end/results/plot.py) from a fixture results file written here."""

import pytest

from end2end.spec.config_file import expand, parse_lines
from end2end.results.plot import Panel, figure7_table, main, make_figure, speedups
from end2end.results.store import ResultRow, append_result, read_results

LINES = ["megatron bert-xlarge 2,4 512 0 8 0", "slapo-megatron bert-xlarge 2,4 512 0 8 0",
         "slapo-megatron bert-xlarge 2,4 512 0 8 0.5",
         "deepspeed bert-xlarge 2,4 512 0 8 0", "slapo-deepspeed bert-xlarge 2,4 512 0 8 0",
         "slapo-megatron roberta-xlarge 2,4 512 0 8 0", "deepspeed roberta-xlarge 2,4 512 0 8 0",
         "eager cpu/bert 1 128 0 4 0", "slapo cpu/bert 1 128 0 4 0"]
THROUGHPUT = {"megatron": 10.0, "slapo-megatron": 12.0, "deepspeed": 8.0,
              "slapo-deepspeed": 11.0, "eager": 2.0, "slapo": 3.0}


@pytest.fixture()
def results_file(tmp_path):
    path = tmp_path / "fixture.tsv"
    for spec in expand(parse_lines(LINES, "fixture.cfg")):
        thr = THROUGHPUT[spec.mode] * spec.n / 2 + (1.0 if spec.ckpt == "0.5" else 0.0)
        if spec.model == "roberta-xlarge" and spec.mode == "deepspeed" and spec.n == 4:
            row = ResultRow.from_spec(spec, "oom", error="CUDA out of memory")
        else:
            row = ResultRow.from_spec(spec, "ok", thrpt=thr, device="cuda: fixture")
        append_result(path, row, {"device": "fixture"})
    return path


def test_table_takes_the_best_setting_and_keeps_failures(results_file):
    table = figure7_table(read_results(results_file).rows, best=True)
    assert [p.model for p in table] == ["bert-xlarge", "roberta-xlarge", "cpu/bert"]
    bert, roberta = Panel("bert-xlarge", 512, 0), Panel("roberta-xlarge", 512, 0)
    assert table[bert][2]["slapo-megatron"].thrpt == 13.0  # max(12, 12+1)
    assert table[bert][2]["slapo-megatron"].rows == 2
    cell = table[roberta][4]["deepspeed"]
    assert (cell.thrpt, cell.status) == (None, "oom")
    assert "megatron" not in table[roberta][2]


def test_speedups(results_file):
    items = {(p.model, n, a, b): r.value for p, n, a, b, r in speedups(figure7_table(
        read_results(results_file).rows, best=True))}
    assert items[("bert-xlarge", 2, "slapo-megatron", "megatron")] == pytest.approx(1.3)
    assert items[("bert-xlarge", 4, "slapo-deepspeed", "deepspeed")] == pytest.approx(11 / 8)
    assert items[("cpu/bert", 1, "slapo", "eager")] == pytest.approx(1.5)
    assert ("roberta-xlarge", 4, "slapo-deepspeed", "deepspeed") not in items  # OOM baseline
    assert items[("bert-xlarge", 2, "best-slapo", "best-baseline")] == pytest.approx(1.3)


def test_figure_panels(results_file):
    fig = make_figure(figure7_table(read_results(results_file).rows, best=True))
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["BERT-1B · seq 512 · bs 8",
                                                  "RoBERTa-1.3B · seq 512 · bs 8",
                                                  "BERT (CPU) · seq 128 · bs 4"]
    assert len(visible[0].patches) == 8  # 4 systems with a throughput x 2 GPU counts
    assert [t.get_text() for t in visible[0].get_xticklabels()] == ["2", "4"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:6] == ["Megatron-LM", "Slapo-TP", "DeepSpeed", "Slapo-ZeRO3", "Eager", "Slapo"]
    assert legend[6:] == ["OOM / failed", "not run"]
    assert len(visible[2].patches) == 2  # CPU panel: only the eager/slapo group


def test_cli_writes_png_and_pdf(results_file, tmp_path, capsys):
    out = tmp_path / "figs" / "fig7"
    assert main([str(results_file), "-o", str(out), "--best"]) == 0
    for suffix in (".png", ".pdf"):
        f = out.parent / ("fig7" + suffix)
        assert f.exists() and f.stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "BERT-1B seq 512 n=2: Slapo-TP / Megatron-LM = 1.30x" in printed


def _rows(lines, thrpt):
    return [ResultRow.from_spec(spec, "ok", thrpt=thrpt[spec.mode], device="cpu")
            for spec in expand(parse_lines(lines, "c.cfg"))]


def test_runs_at_other_sequence_lengths_are_never_compared(tmp_path, capsys):
    """Issue 19: 'Slapo / Eager = 4.84x' came from eager at seq 64/bs 2 vs Slapo at 128/bs 8."""
    path = tmp_path / "r.tsv"
    for row in _rows(["eager cpu/bert 1 64 0 2 0", "slapo cpu/bert 1 128 0 8 0"],
                     {"eager": 1.0, "slapo": 4.84}):
        append_result(path, row, {"device": "cpu"})
    assert main([str(path), "-o", str(tmp_path / "fig")]) == 0
    out = capsys.readouterr().out
    assert "Slapo / Eager" not in out and "no comparable pairs" in out
    table = figure7_table(read_results(path).rows)
    assert list(table) == [Panel("cpu/bert", 64, 0), Panel("cpu/bert", 128, 0)]


def test_one_system_at_two_settings_is_refused_naming_the_clash(tmp_path, capsys):
    path = tmp_path / "r.tsv"
    for row in _rows(["slapo cpu/bert 1 128 0 2 0", "slapo cpu/bert 1 128 0 8 0",
                      "eager cpu/bert 1 128 0 2 0"], {"eager": 1.0, "slapo": 2.0}):
        append_result(path, row, {"device": "cpu"})
    assert main([str(path), "-o", str(tmp_path / "fig")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "Slapo cpu/bert seq 128 n=1 has rows at batch 2 ckpt 0 and batch 8 ckpt 0" in err
    assert "--best" in err and not (tmp_path / "fig.png").exists()
    assert main([str(path), "-o", str(tmp_path / "fig"), "--best"]) == 0


def test_a_system_without_any_row_keeps_its_slot_and_legend_entry(tmp_path):
    path = tmp_path / "r.tsv"
    for row in _rows(["slapo-megatron cpu/bert 2 128 0 4 0", "deepspeed cpu/bert 2 128 0 4 0",
                      "slapo-deepspeed cpu/bert 2 128 0 4 0"],
                     {"slapo-megatron": 3.0, "deepspeed": 2.0, "slapo-deepspeed": 2.5}):
        append_result(path, row, {"device": "cpu"})
    fig = make_figure(figure7_table(read_results(path).rows))
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["Megatron-LM", "Slapo-TP", "DeepSpeed", "Slapo-ZeRO3", "OOM / failed",
                      "not run"]
    (ax,) = [ax for ax in fig.axes if ax.get_visible()]
    assert len(ax.patches) == 3  # three bars ...
    grey = [line for line in ax.lines if line.get_color() == "#aaaaaa"]
    assert len(grey) == 1 and grey[0].get_xdata()[0] < min(p.get_x() for p in ax.patches)


def _repeated(path, lines, thrpt_by_mode_and_repeat):
    """Rows of ``lines`` in interleaved rounds; ``thrpt[mode][r]`` (None = a failed repeat)."""
    from end2end.spec.config_file import interleave

    specs = interleave(list(expand(parse_lines(lines, "c.cfg"))),
                       len(next(iter(thrpt_by_mode_and_repeat.values()))))
    for spec in specs:
        value = thrpt_by_mode_and_repeat[spec.mode][spec.repeat]
        row = (ResultRow.from_spec(spec, "ok", thrpt=value, device="cpu") if value is not None
               else ResultRow.from_spec(spec, "fail", error="boom", device="cpu"))
        append_result(path, row, {"device": "cpu"})
    return read_results(path).rows


def test_repeats_make_one_bar_at_the_median_with_min_max(tmp_path):
    rows = _repeated(tmp_path / "r.tsv", ["eager cpu/bert 1 128 0 4 0",
                                          "slapo cpu/bert 1 128 0 4 0"],
                     {"eager": [2.0, 2.2, 1.0], "slapo": [3.0, None, 3.3]})
    cells = figure7_table(rows)[Panel("cpu/bert", 128, 0)][1]
    eager, slapo = cells["eager"], cells["slapo"]
    assert (eager.thrpt, eager.samples.lo, eager.samples.hi, eager.rows) == (2.0, 1.0, 2.2, 3)
    assert slapo.thrpt == pytest.approx(3.15) and slapo.failed == 1  # median of the ok ones
    (pair, best) = speedups(figure7_table(rows))
    assert pair.ratio.value == pytest.approx(3.15 / 2.0)
    # rounds 0 and 2 only for slapo: not the same rounds, so the widest range the samples allow
    assert (pair.ratio.lo, pair.ratio.hi) == (pytest.approx(3.0 / 2.2), pytest.approx(3.3))
    assert not pair.ratio.within_noise and pair.ratio.label == "1.57x"
    assert best.system == "best-slapo" and best.ratio.value == pair.ratio.value


def test_paired_rounds_give_the_ratio_range_and_overlap_is_within_noise(tmp_path, capsys):
    path = tmp_path / "r.tsv"
    _repeated(path, ["megatron cpu/bert 2 128 0 4 0", "slapo-megatron cpu/bert 2 128 0 4 0"],
              {"megatron": [1.0, 1.2, 1.1], "slapo-megatron": [1.1, 1.0, 1.3]})
    (pair, _) = speedups(figure7_table(read_results(path).rows))
    # paired: the median of the per-round ratios 1.1, 0.83, 1.18 (the medians' ratio would be 1.0)
    assert pair.ratio.value == pytest.approx(1.1 / 1.0)
    assert (pair.ratio.lo, pair.ratio.hi) == (pytest.approx(1.0 / 1.2), pytest.approx(1.3 / 1.1))
    assert pair.ratio.within_noise and pair.ratio.label == "~"
    assert main([str(path), "-o", str(tmp_path / "fig")]) == 0
    assert ("Slapo-TP / Megatron-LM = 1.10x (0.83-1.18, 3 repeats) ~ within noise"
            in capsys.readouterr().out)


def test_figure_draws_whiskers_and_tilde_labels(tmp_path):
    rows = _repeated(tmp_path / "r.tsv", ["megatron cpu/bert 2 128 0 4 0",
                                          "slapo-megatron cpu/bert 2 128 0 4 0",
                                          "deepspeed cpu/bert 2 128 0 4 0",
                                          "slapo-deepspeed cpu/bert 2 128 0 4 0"],
                     {"megatron": [1.0, 1.2, 1.1], "slapo-megatron": [1.1, 1.0, 1.3],
                      "deepspeed": [1.0, 1.1, 1.05], "slapo-deepspeed": [2.0, 2.1, 2.2]})
    fig = make_figure(figure7_table(rows))
    (ax,) = [ax for ax in fig.axes if ax.get_visible()]
    assert sorted(t.get_text() for t in ax.texts) == ["2.00x", "~"]
    whiskers = [c for c in ax.collections if c.get_segments()]
    assert len(whiskers) == 4  # one min-max line per repeated bar
    tops = sorted(max(seg[:, 1]) for c in whiskers for seg in c.get_segments())
    assert tops == pytest.approx([1.1, 1.2, 1.3, 2.2])


def test_runs_with_knobs_are_systems_of_their_own_compared_with_the_mode_baseline(tmp_path,
                                                                                    capsys):
    from end2end.spec.config_file import make_run_spec

    path = tmp_path / "r.tsv"
    for repeat in range(2):
        for mode, knobs, thr in (("eager", "", 2.0), ("slapo", "", 2.1),
                                 ("slapo", "fuse_bias_gelu=True", 2.6 + repeat / 10)):
            spec = make_run_spec(mode, "cpu/bert", 1, 256, 0, 4, "0", knobs=knobs,
                                 repeat=repeat)
            append_result(path, ResultRow.from_spec(spec, "ok", thrpt=thr + repeat / 100,
                                                    device="cpu"), {"device": "cpu"})
    table = figure7_table(read_results(path).rows)
    cells = table[Panel("cpu/bert", 256, 0)][1]
    assert sorted(cells) == ["eager", "slapo", "slapo [fuse_bias_gelu=True]"]
    assert cells["slapo [fuse_bias_gelu=True]"].thrpt == pytest.approx(2.655)
    fig = make_figure(table)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:3] == ["Eager", "Slapo", "Slapo [fuse_bias_gelu=True]"]
    (ax,) = [ax for ax in fig.axes if ax.get_visible()]
    assert sorted(t.get_text() for t in ax.texts) == ["1.05x", "1.32x"]
    assert main([str(path), "-o", str(tmp_path / "fig")]) == 0
    assert "Slapo [fuse_bias_gelu=True] / Eager = 1.32x (1.30-1.35, 2 repeats)" in \
        capsys.readouterr().out


def test_markdown_table_has_medians_ranges_and_ratios(tmp_path, capsys):
    path = tmp_path / "r.tsv"
    _repeated(path, ["megatron cpu/bert 2 128 0 4 0", "slapo-megatron cpu/bert 2 128 0 4 0",
                     "deepspeed cpu/bert 2 128 0 4 0"],
              {"megatron": [1.0, 1.2, 1.1], "slapo-megatron": [1.5, 1.4, 1.6],
               "deepspeed": [None, None, None]})
    assert main([str(path), "-o", str(tmp_path / "fig"), "--table"]) == 0
    out = capsys.readouterr().out
    assert "| Model (seq, batch), n | Megatron-LM | Slapo-TP | DeepSpeed | Slapo-ZeRO3 | " \
           "Slapo-TP / Megatron-LM |" in out
    assert "| `cpu/bert` (128, 4), 2 | 1.1 (1-1.2) | 1.5 (1.4-1.6) | fail | – | " \
           "1.45x (1.17-1.50) |" in out  # median of 1.50, 1.17, 1.45


def test_a_machine_drifting_between_rounds_does_not_hide_a_consistent_ratio(tmp_path):
    """The bars overlap (the whole machine was twice as fast in round 1), but Slapo is 0.9x of
    the baseline in every round: a result, not noise. Unpaired rounds fall back to overlap."""
    rows = _repeated(tmp_path / "r.tsv", ["megatron cpu/t5 2 128 64 4 0",
                                          "slapo-megatron cpu/t5 2 128 64 4 0"],
                     {"megatron": [1.0, 2.0, 1.5], "slapo-megatron": [0.9, 1.8, 1.35]})
    (pair, _) = speedups(figure7_table(rows))
    assert (pair.ratio.lo, pair.ratio.hi) == (pytest.approx(0.9), pytest.approx(0.9))
    assert not pair.ratio.within_noise and pair.ratio.label == "0.90x"
    from end2end.results.stats import Samples

    unpaired = Samples.of([(0, 0.9), (1, 1.8)]).ratio(Samples.of([(0, 1.0), (2, 2.0)]))
    assert unpaired.within_noise and unpaired.label == "~"


def test_a_results_file_that_cannot_be_read_is_one_line(tmp_path, capsys):
    missing = tmp_path / "nope.tsv"
    assert main([str(missing), "-o", str(tmp_path / "fig")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err == f"end2end.plot: error: cannot read results '{missing}': No such file or " \
                  "directory.\n"
    headless = tmp_path / "x.tsv"
    headless.write_text("not\ta results file\n")
    assert main([str(headless), "-o", str(tmp_path / "fig")]) == 2
    assert capsys.readouterr().err == f"end2end.plot: error: {headless}: no header line " \
                                      "starting with 'Impl'.\n"
