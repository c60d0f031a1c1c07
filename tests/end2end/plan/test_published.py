"""The published-layout table (docs/results/plan/published_layouts.tsv) and its comparer
(``python -m end2end.plan.published``): the committed rows parse, a malformed row is one line
naming the file, the line and the row's id; on a tiny model, the published layout is simulated
beside the planner's best with their ratio and the reason they differ, and a layout the driver
refuses is recorded with its error, never dropped."""

from dataclasses import replace
from pathlib import Path

import pytest

from end2end.plan.layouts import COLUMNS, LayoutTableError, parse_layouts, read_layouts
from end2end.plan.predict import Prediction
from end2end.plan.published import RESULT_COLUMNS, WITHIN, main, why_different

ROOT = Path(__file__).resolve().parents[3]
TINY = dict(id="tiny", model="tiny/llama", cluster="h100-80gb:2x1", seq="64", global_batch="4",
            dtype="bf16", mode="slapo", tp="2", pp="1", dp="1", micro="4", ckpt="0", knobs="",
            published_layout="TP 2 on two GPUs", published_metric="tokens_per_s",
            published_value="1000", source="a test", location="here", version="-",
            cannot_express="-")


def _table(*rows: dict) -> str:
    lines = ["# a comment", "\t".join(COLUMNS)]
    return "\n".join(lines + ["\t".join({**TINY, **r}[c] for c in COLUMNS) for r in rows]) + "\n"


def test_the_committed_table_parses_with_several_sources(monkeypatch):
    monkeypatch.chdir(ROOT)  # the MPT rows name their config.json from the repository root
    rows = read_layouts()
    assert len(rows) >= 8 and len({r.id for r in rows}) == len(rows)
    assert len({r.source for r in rows}) >= 3
    assert all(r.cannot_express and r.location for r in rows)
    first = next(r for r in rows if r.id == "meg21-1.7b")
    assert (first.tp, first.pp, first.dp, first.gpus) == (1, 1, 32, 32)
    assert first.measured_samples_s() > 0


def test_a_tiny_row_reads_as_its_candidate():
    (row,) = parse_layouts(_table({}), "t.tsv")
    cand = row.candidate()
    assert (row.line, row.gpus, row.published_value) == (3, 2, 1000.0)
    assert (cand.mode, cand.tp, cand.pp, cand.dp, cand.micro, cand.accumulation) == \
        ("slapo", 2, 1, 1, 4, 1)
    assert row.measured_samples_s() == pytest.approx(1000 / 64)


@pytest.mark.parametrize("change, message", [
    ({"tp": "two"}, r"t\.tsv:3 \(tiny\): tp 'two' is not an integer"),
    ({"dp": "2"}, r"t\.tsv:3 \(tiny\): tp 2 x pp 1 x dp 2 = 4 GPUs, but h100-80gb:2x1 has 2"),
    ({"mode": "nope"}, r"t\.tsv:3 \(tiny\): unknown mode 'nope'"),
    ({"cluster": "h100-80gb:8"}, r"t\.tsv:3 \(tiny\): cluster 'h100-80gb:8' does not parse"),
    ({"micro": "2"}, None),  # valid: gradient accumulation, which every mode runs
    ({"global_batch": "6", "micro": "6", "dp": "1"}, None),  # valid: only checks it parses
    ({"published_metric": "none"}, r"published_value '1000' does not go with metric 'none'"),
    ({"dtype": "fp8"}, r"t\.tsv:3 \(tiny\): dtype 'fp8' is unknown"),
    ({"model": "llama:colour=3"}, r"t\.tsv:3 \(tiny\): .*colour"),
    ({"knobs": "sequence_paralel=True"}, r"t\.tsv:3 \(tiny\): .*sequence_paralel.*did you mean"),
    ({"knobs": "sequence_parallel=True", "mode": "fsdp"}, r"t\.tsv:3 \(tiny\): .*Slapo modes"),
    ({"knobs": "vocab_parallel_loss=True,sequence_parallel=True"},
     r"not in canonical form.*'sequence_parallel=True,vocab_parallel_loss=True'"),
    ({"knobs": "sequence_parallel=True"}, None),
])
def test_a_malformed_row_is_one_line_naming_the_row(change, message):
    if message is None:
        row = parse_layouts(_table(change), "t.tsv")[0]
        assert row.global_batch == int(change.get("global_batch", 4))
        assert row.candidate().knobs == change.get("knobs", "")
        return
    with pytest.raises(LayoutTableError, match=message) as err:
        parse_layouts(_table(change), "t.tsv")
    assert "\n" not in str(err.value)


def test_a_table_with_a_wrong_header_a_short_row_or_a_repeated_id_is_refused():
    with pytest.raises(LayoutTableError, match=r"t\.tsv:1: the header is not"):
        parse_layouts("id\tmodel\n", "t.tsv")
    with pytest.raises(LayoutTableError, match=r"t\.tsv:3 \(tiny\): 19 tab-separated fields"):
        parse_layouts(_table({}).replace("\t-\n", "\n"), "t.tsv")
    with pytest.raises(LayoutTableError, match=r"t\.tsv:4 \(tiny\): the id is used twice"):
        parse_layouts(_table({}, {}), "t.tsv")


def test_why_names_the_layout_changes_the_phases_that_differ_most_and_memory():
    pub = parse_layouts(_table({}), "t.tsv")[0].candidate()
    best = replace(pub, mode="slapo-fsdp", tp=1, ckpt="0.5")
    phases = dict(compute=1.0, recompute=0.2, communication=0.3, bubble=0.0)
    fast = dict(compute=1.0, recompute=0.1, communication=0.05, bubble=0.0)
    why = why_different(pub, Prediction("sim", "", 10.0, 1.5, 40.0, 42.0, 0.3, phases),
                        best, Prediction("sim", "", 13.0, 1.15, 30.0, 32.0, 0.4, fast),
                        "not in space")
    assert why.startswith("mode slapo -> slapo-fsdp, tp 2 -> 1, dp 1 -> 2, ckpt 0 -> 0.5; ")
    assert "step 1.5 s -> 1.15 s (communication -0.25 s, recompute -0.1 s)" in why
    assert "memory 40 -> 30 GB/rank" in why and "not in the planner's space" in why
    oom = why_different(pub, Prediction("sim-oom", "predicted 90.0 GB per rank > 80.0 GB"),
                        best, Prediction("sim", "", 13.0, 1.15), "simulated")
    assert oom.endswith("the published layout is predicted sim-oom: predicted 90.0 GB per "
                        "rank > 80.0 GB")
    assert why_different(pub, Prediction("sim"), pub, Prediction("sim"), "simulated") == \
        "the planner chose the published layout"
    assert why_different(pub, Prediction("sim"), None, None, "") == \
        "the planner found no candidate predicted to fit"


def _rows(path: Path) -> list:
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
    assert lines[0].split("\t") == list(RESULT_COLUMNS)
    return [dict(zip(RESULT_COLUMNS, ln.split("\t"))) for ln in lines[1:]]


def test_the_comparer_on_a_tiny_row_and_a_refused_one(tmp_path, capsys):
    table, out = tmp_path / "layouts.tsv", tmp_path / "out" / "published.tsv"
    # slapo-megatron builds no pipeline: the driver refuses the layout, the row records it
    table.write_text(_table({"mode": "slapo-megatron", "tp": "1", "dp": "2", "micro": "2"},
                            {"id": "refused", "mode": "slapo-megatron", "tp": "1", "pp": "2",
                             "micro": "2"}))
    assert main(["--table", str(table), "--out", str(out), "--max-candidates", "2",
                 "--cache", str(tmp_path / "cache")]) == 0
    tiny, refused = _rows(out)
    assert tiny["id"] == "tiny" and tiny["status"] == "ok", tiny
    assert tiny["published"] == "slapo-megatron tp1 pp1 dp2 mb2 ckpt=0"
    assert tiny["published_status"] == "sim" and float(tiny["published_samples_s"]) > 0
    pub, best = float(tiny["published_samples_s"]), float(tiny["planner_samples_s"])
    assert best > 0 and tiny["planner_best"]
    assert float(tiny["ratio"]) == pytest.approx(best / pub, rel=1e-3)
    assert tiny["within_10pct"] == ("yes" if best >= WITHIN * pub else "no")
    assert tiny["published_in_space"] in ("simulated", "in space, not simulated")
    assert tiny["why"] and float(tiny["measured_samples_s"]) == pytest.approx(1000 / 64, 1e-3)
    assert int(tiny["candidates_simulated"]) == 2
    if tiny["planner_best"] != tiny["published"]:
        assert "step" in tiny["why"] and "GB/rank" in tiny["why"]
    # the refused layout: recorded with the driver's reason, the planner's choice beside it
    assert refused["status"] == "ok" and refused["published_status"] == "refused"
    assert "published:" in refused["error"] and "pipeline" in refused["error"]
    assert refused["within_10pct"] == "n/a" and refused["ratio"] == ""
    assert refused["planner_best"] and "driver refuses" in refused["why"]
    assert tiny["commit"] and tiny["finished"] and "max_candidates=2" in tiny["options"]
    # --only runs its rows again and keeps the others, in the table's order
    refused_line = out.read_text().splitlines()[-1]
    assert main(["--table", str(table), "--out", str(out), "--only", "tiny",
                 "--max-candidates", "1", "--cache", str(tmp_path / "cache")]) == 0
    again = _rows(out)
    assert [r["id"] for r in again] == ["tiny", "refused"]
    assert "max_candidates=1" in again[0]["options"] and int(again[0]["candidates_simulated"]) == 1
    assert out.read_text().splitlines()[-1] == refused_line
    # --only names a row; an unknown one is one line on stderr
    capsys.readouterr()
    assert main(["--table", str(table), "--out", str(out), "--only", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--only nope: not a row of" in err and "tiny, refused" in err and "\n" not in err


def test_merging_into_a_results_file_of_other_columns_is_one_line(tmp_path, capsys):
    table, out = tmp_path / "layouts.tsv", tmp_path / "published.tsv"
    table.write_text(_table({"mode": "slapo-megatron", "tp": "1", "dp": "2", "micro": "2"}))
    out.write_text("id\tstatus\ntiny\tok\n")
    assert main(["--table", str(table), "--out", str(out), "--only", "tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert "columns are not this version's" in err and "\n" not in err
    assert out.read_text() == "id\tstatus\ntiny\tok\n"  # nothing ran, nothing changed
