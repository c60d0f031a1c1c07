"""Results as pandas DataFrames (end2end/results/stats.py) and the aggregation on them
(end2end/results/summary.py): types, ``na`` as NaN, repeats grouped into one bar, per-round
ratios against hand-computed values, the Markdown table's rows and columns."""

import logging

import pandas as pd
import pytest

from end2end.results.stats import FRAME_TYPES, Samples, results_frame, to_frame
from end2end.results.store import COLUMNS, ResultRow, append_result
from end2end.results.summary import Panel, figure7_table, format_markdown, speedups
from end2end.spec.config_file import make_run_spec


def _row(mode, thrpt, repeat=0, n=2, status="ok", model="cpu/bert", batch=4):
    spec = make_run_spec(mode, model, n, 128, 0, batch, "0", repeat=repeat)
    if status != "ok":
        return ResultRow.from_spec(spec, status, error="boom", device="cpu")
    return ResultRow.from_spec(spec, "ok", thrpt=thrpt, device="cpu")


def test_frame_columns_types_and_na(tmp_path):
    path = tmp_path / "r.tsv"
    append_result(path, _row("eager", 2.5), {"device": "cpu"})
    append_result(path, _row("slapo", None, status="oom"), {"device": "cpu"})
    frame = results_frame(path)
    assert list(frame.columns) == list(COLUMNS) + ["File"]
    assert frame.File.tolist() == [str(path)] * 2
    assert {col: str(frame[col].dtype) for col in COLUMNS} == FRAME_TYPES
    assert str(frame.Seq.dtype) == "int64" and str(frame.Repeat.dtype) == "int64"
    assert str(frame.Thrpt.dtype) == "float64" and str(frame.TP.dtype) == "float64"
    assert frame.Thrpt.iloc[0] == 2.5 and pd.isna(frame.Thrpt.iloc[1])  # "na" in the TSV
    assert pd.isna(frame.MFU).all() and frame.Status.tolist() == ["ok", "oom"]
    assert frame.Knobs.tolist() == ["", ""]  # text stays text (empty, not NaN)
    empty = to_frame([])
    assert len(empty) == 0 and {c: str(empty[c].dtype) for c in COLUMNS} == FRAME_TYPES


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_results_frame_concatenates_files_and_logs_their_warnings(tmp_path):
    first, second = tmp_path / "a.tsv", tmp_path / "b.tsv"
    append_result(first, _row("eager", 1.0))
    append_result(second, _row("slapo", 2.0))
    with open(second, "a") as fh:
        fh.write("slapo\tcpu/bert\t128")  # torn last line
    records, logger = _Records(), logging.getLogger("end2end.results")
    logger.addHandler(records)  # the harness's loggers do not propagate to pytest's caplog
    try:
        frame = results_frame([first, second])
    finally:
        logger.removeHandler(records)
    assert frame.Impl.tolist() == ["eager", "slapo"]
    assert frame.File.tolist() == [str(first), str(second)]
    assert any(m.startswith(f"warning: {second}:4: skipped malformed row")
               for m in records.messages)
    assert len(results_frame([])) == 0


def test_per_round_ratio_by_hand():
    """Rounds 0, 1, 2: 2/1, 3/4, 5/4 = 2.0, 0.75, 1.25 -> median 1.25, range 0.75-2.0, which
    includes 1.0: within noise (the medians' ratio would be 3/4 = 0.75)."""
    slapo = Samples.of([(0, 2.0), (1, 3.0), (2, 5.0)])
    base = Samples.of([(2, 4.0), (0, 1.0), (1, 4.0)])
    ratio = slapo.ratio(base)
    assert (ratio.value, ratio.lo, ratio.hi) == (1.25, 0.75, 2.0)
    assert ratio.within_noise and ratio.repeats == 3 and ratio.label == "~"
    # ahead in every round: 1.5, 1.2, 1.1 -> 1.2x, not within noise
    ahead = Samples.of([(0, 3.0), (1, 4.8), (2, 4.4)]).ratio(
        Samples.of([(0, 2.0), (1, 4.0), (2, 4.0)]))
    assert ahead.value == pytest.approx(1.2) and not ahead.within_noise
    assert (ahead.lo, ahead.hi) == (pytest.approx(1.1), pytest.approx(1.5))
    # rounds that do not pair up: the ratio of the medians, the widest range
    unpaired = Samples.of([(0, 2.0), (1, 3.0)]).ratio(Samples.of([(0, 1.0), (2, 2.0)]))
    assert unpaired.value == pytest.approx(2.5 / 1.5)
    assert (unpaired.lo, unpaired.hi) == (1.0, 3.0) and unpaired.within_noise


def test_repeats_group_into_one_bar_and_pair_by_round():
    """A repeat index read twice (one run appended to two files) counts once, at its best;
    the bar is the median over rounds and the speedup the median of the per-round ratios."""
    rows = [_row("megatron", v, r) for r, v in enumerate([1.0, 4.0, 4.0])]
    rows += [_row("slapo-megatron", v, r) for r, v in enumerate([2.0, 3.0, 5.0])]
    rows += [_row("slapo-megatron", 1.0, 2), _row("megatron", None, 3, status="fail")]
    cells = figure7_table(rows)[Panel("cpu/bert", 128, 0)][2]
    slapo, base = cells["slapo-megatron"], cells["megatron"]
    assert slapo.samples.values == ((0, 2.0), (1, 3.0), (2, 5.0)) and slapo.thrpt == 3.0
    assert (slapo.rows, slapo.failed) == (4, 0)
    assert (base.thrpt, base.rows, base.failed) == (4.0, 4, 1)
    pair, best = speedups(figure7_table(rows))
    assert (pair.system, pair.baseline) == ("slapo-megatron", "megatron")
    assert (pair.ratio.value, pair.ratio.lo, pair.ratio.hi) == (1.25, 0.75, 2.0)
    assert (best.system, best.baseline, best.ratio) == ("best-slapo", "best-baseline",
                                                        pair.ratio)


def test_best_slapo_against_best_baseline_takes_the_best_medians():
    rows = [_row("eager", 1.0, n=1), _row("slapo", 1.5, n=1),
            _row("slapo", 3.0, n=1, batch=8), _row("eager", 2.0, n=1, batch=8)]
    table = figure7_table(rows, best=True)  # each system at its best batch
    (pair, best) = speedups(table)
    assert pair.ratio.value == best.ratio.value == 1.5  # 3.0 (batch 8) / 2.0 (batch 8)
    two = [_row("megatron", 1.0), _row("deepspeed", 2.0), _row("slapo-megatron", 3.0),
           _row("slapo-deepspeed", 2.5)]
    found = {(s.system, s.baseline): s.ratio.value for s in speedups(figure7_table(two))}
    assert found == {("slapo-megatron", "megatron"): 3.0, ("slapo-deepspeed", "deepspeed"): 1.25,
                     ("best-slapo", "best-baseline"): 1.5}  # 3.0 / 2.0


def test_markdown_rows_in_table_order_and_gpu_counts_ascending():
    rows = [_row("eager", 1.0, n=4, model="cpu/gpt2"), _row("slapo", 2.0, n=4, model="cpu/gpt2"),
            _row("eager", 1.0, n=1), _row("eager", 1.0, n=1, model="cpu/gpt2"),
            _row("slapo", 1.5, n=1, model="cpu/gpt2")]
    table = figure7_table(rows)
    text = format_markdown(table, speedups(table)).splitlines()
    assert text[0] == "| Model (seq, batch), n | Eager | Slapo | Slapo / Eager |"
    assert text[2:] == ["| `cpu/gpt2` (128, 4), 1 | 1 | 1.5 | 1.50x |",
                        "| `cpu/gpt2` (128, 4), 4 | 1 | 2 | 2.00x |",
                        "| `cpu/bert` (128, 4), 1 | 1 | – | – |"]
    assert format_markdown({}, []) == "| Model (seq, batch), n |\n|---|"
