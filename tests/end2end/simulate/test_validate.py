"""``python -m end2end.simulate.validate`` and the validation set of published GPU measurements
(issue 35, item 4): the committed set meets its requirements (size, sources, GPU generations,
systems, memory points, a published OOM, every field of the source table), its model shapes
have the published parameter counts, the published metrics convert to samples/s by their
sources' own counts, and a row, the summary, the results file and the report block come out
right (a tiny set simulated for real)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from end2end.models import build_model, count_parameters
from end2end.simulate.validate import (DEFAULT_SOURCES, compare, load_points, main,
                                       megatron_flops_per_sample, published_samples,
                                       read_results, summarize, summary_text, write_results)
from slapo.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


def _sources():
    with open(DEFAULT_SOURCES, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_the_committed_set_meets_the_issue():
    points = load_points()
    val = [p for p in points if p.part == "validation"]
    assert len(val) >= 15 and len({p.id for p in points}) == len(points)
    assert len({p.info["source"] for p in val}) >= 4
    assert len({p.device.split("-")[0] for p in val}) >= 3  # v100, a100, h100
    assert {p.spec.framework for p in val} >= {"torch", "megatron", "fsdp"}
    assert any(p.spec.framework == "torch" and p.spec.parallel_sizes[2] > 1 for p in val)  # DDP
    assert any(p.memory_gib for p in val) and any(not p.fits for p in val)
    for row in _sources():  # every field of the source table is filled
        for key in ("source", "location", "version", "hardware", "system", "precision",
                    "recompute"):
            assert row[key].strip(), (row["id"], key)
        assert row["metric"] == "oom" or float(row["value"]) > 0


def test_model_shapes_have_the_published_parameter_counts():
    """MPT's table gives NumParams per row: the GPT-2 shape written for it has that count."""
    for p in load_points():
        published = re.search(r"NumParams (\d+)", p.info["location"])
        if published:
            model = build_model(p.spec.model, device="meta")
            assert count_parameters(model) == int(published.group(1)), p.id
    llama3_8b = next(p for p in load_points() if p.id == "tt-h100-llama31-8b-n8")
    assert count_parameters(build_model(llama3_8b.spec.model, device="meta")) == 8_030_261_248


HOLDOUT = (ROOT / "docs/results/validation/holdout.cfg",
           ROOT / "docs/results/validation/holdout_sources.tsv")


def test_the_held_out_points_are_new_and_complete():
    """The held-out set (chosen after the model was fixed, never used to change it) shares no
    run with the validation set, fills every source field, and its MPT shapes have the
    published parameter counts."""
    held = load_points(*HOLDOUT)
    assert len(held) >= 8 and all(p.part == "validation" for p in held)
    assert not {p.spec.key for p in held} & {p.spec.key for p in load_points()}
    assert not {p.id for p in held} & {p.id for p in load_points()}
    for p in held:
        assert published_samples(p) > 0, p.id
        for key in ("source", "location", "version", "hardware", "system", "precision"):
            assert p.info[key].strip(), (p.id, key)
        published = re.search(r"NumParams (\d+)", p.info["location"])
        if published:
            model = build_model(p.spec.model, device="meta")
            assert count_parameters(model) == int(published.group(1)), p.id


def test_published_metrics_become_samples_per_second():
    by_id = {p.id: p for p in load_points()}
    assert published_samples(by_id["dle-v100-s128-n8"]) == 1305.6
    # torchtitan: tokens/s per GPU x GPUs / sequence
    assert published_samples(by_id["tt-h100-llama31-8b-n8"]) == pytest.approx(5762 * 8 / 8192)
    # llm-foundry: tokens/s of the job / sequence
    assert published_samples(by_id["mpt-h100-7b-n8"]) == pytest.approx(85144 / 2048)
    # Megatron: the paper's count, 96 s l h^2 (1 + s/6h + V/16lh) per sample
    meg = by_id["meg-a100-1.7b"]
    per_sample = 96 * 2048 * 24 * 2304**2 * (1 + 2048 / (6 * 2304) + 51200 / (16 * 24 * 2304))
    assert megatron_flops_per_sample(meg.spec) == pytest.approx(per_sample)
    assert published_samples(meg) == pytest.approx(137e12 * 32 / per_sample)
    assert published_samples(by_id["tt-a100-llama2-70b-sel-op-b2-oom"]) is None


def _values(thrpt, peak_gb, needed_gb, status="sim"):
    return dict(status=status, thrpt=thrpt, error="",
                extra=dict(memory=[dict(peak=peak_gb * 2**30)], needed_bytes=needed_gb * 2**30,
                           simulate_seconds=1.0))


def test_rows_summary_file_and_report_block(tmp_path):
    from end2end.report.validation_table import sources_block, validation_block

    by_id = {p.id: p for p in load_points()}
    h100 = compare(by_id["tt-h100-llama31-8b-n8"], _values(5.0, 70.0, 85.0))
    assert h100["thr_err"] == pytest.approx(5.0 / (5762 * 8 / 8192) - 1)
    assert h100["pred_mem_gib"] == pytest.approx(77.0)  # + 10 % allocator overhead
    assert h100["mem_err"] == pytest.approx(77.0 / 82.4 - 1)
    assert h100["pred_fits"] is True  # 85 GiB within the 96 GB card, not the 80 GB profile
    assert h100["pred_tok_s_gpu"] == pytest.approx(5.0 * 8192 / 8)
    oom = compare(by_id["tt-a100-llama2-70b-sel-op-b2-oom"], _values(1.0, 90.0, 100.0, "sim-oom"))
    assert oom["pred_fits"] is False and oom["thr_err"] is None
    crashed = compare(by_id["mpt-h100-7b-n8"], dict(status="fail", error="rank 0: boom"))
    assert crashed["pred_fits"] is None and crashed["note"] == "rank 0: boom"
    rows = [h100, oom, crashed]
    s = summarize(rows)
    assert s["throughput_rows"] == 1 and s["oom_agreed"] == 1 and s["not_simulated"] == 1
    assert s["false_oom"] == 0 and s["mem_max_err"] == pytest.approx(abs(77.0 / 82.4 - 1))
    text = summary_text(rows, "validation")  # throughput -11 %, memory -7 %, the OOM agreed
    assert "MAPE <= 20 % met" in text and "memory within 15 % met" in text and "OOMs met" in text
    assert "OOMs not met" in summary_text([dict(oom, pred_fits=True)], "validation")
    without_memory = summary_text([dict(h100, mem_err=None, pub_mem_gib=None)], "validation")
    assert "memory within 15 % not judged (no published number)" in without_memory
    assert "memory within 15 % not met" in summary_text([dict(h100, mem_err=0.2)], "validation")
    out = tmp_path / "docs" / "v.tsv"
    write_results(out, rows, {"command": "python -m end2end.simulate.validate", "date": "d",
                              "machine": "m", "commit": "c"})
    header, back = read_results(out)
    assert header["commit"] == "c" and [r["id"] for r in back] == [r["id"] for r in rows]
    assert back[0]["thr_err"] == pytest.approx(h100["thr_err"], rel=1e-3)
    assert back[1]["pred_fits"] is False and back[2]["pred_fits"] is None
    text = validation_block(tmp_path, ["docs/v.tsv"])
    assert "`tt-h100-llama31-8b-n8`" in text and "commit c" in text and "**no**" in text
    sources = sources_block(ROOT, [])
    assert sources.count("\n") == len(_sources()) + 1 and "Table 1" in sources


def test_a_broken_set_is_one_line(tmp_path, capsys):
    cfg, src = tmp_path / "v.cfg", tmp_path / "s.tsv"
    src.write_text(DEFAULT_SOURCES.read_text())
    cfg.write_text("eager tiny/bert 1 32 0 4 0\n")
    with pytest.raises(ConfigError, match="v.cfg:1: run line without a source row"):
        load_points(cfg, src)
    cfg.write_text("eager tiny/bert 1 32 0 4 0  # dle-v100-s128-n1\n")
    with pytest.raises(ConfigError, match="not in v.cfg"):
        load_points(cfg, src)
    assert main(["--rows", "no-such-point"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no point selected" in err[0]


@pytest.mark.timeout(300)
def test_the_command_simulates_a_tiny_set(tmp_path, capsys):
    cfg, src = tmp_path / "v.cfg", tmp_path / "s.tsv"
    cfg.write_text("#@ dtype=fp16\neager tiny/bert 2 32 0 8 0  # tiny-dp\n"
                   "eager tiny/bert 1 32 0 4 0  # tiny-one\n")
    header = DEFAULT_SOURCES.read_text().splitlines()[0]
    fields = header.split("\t")
    lines = [header]
    for pid, part in (("tiny-dp", "validation"), ("tiny-one", "calibration")):
        row = dict.fromkeys(fields, "x")
        row.update(id=pid, part=part, device="v100-32gb", card_gib="", metric="samples_per_s",
                   value="100", memory_gib="", fits="yes")
        lines.append("\t".join(row[f] for f in fields))
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.tsv"
    assert main(["--cfg", str(cfg), "--sources", str(src), "--rows", "tiny-dp",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tiny-dp" in printed and "tiny-one" not in printed and "validation: 1 rows" in printed
    header, rows = read_results(out)
    assert header["command"].endswith("--out " + str(out)) and len(rows) == 1
    assert rows[0]["status"] == "sim" and rows[0]["pred_samples_s"] > 0
    assert rows[0]["thr_err"] == pytest.approx(rows[0]["pred_samples_s"] / 100 - 1, rel=1e-3)
    assert rows[0]["pred_fits"] is True and "tp=1" in rows[0]["run"]
