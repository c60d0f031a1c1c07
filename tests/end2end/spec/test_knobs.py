"""Model-schedule knobs through the driver (``--knob``, ``#@ knobs=``, the ``Knobs`` column) and
the repeat index (``--repeat``, the ``Repeat`` column): parsing, validation with errors that
name the valid knobs, the run key, results files written before these columns existed, and a
2-rank run where the knob really changes the schedule (replicated embedding: more parameters
per rank) while bad knobs become ``fail`` rows."""

import pytest

from end2end.driver.bench import parse_args, run_bench
from end2end.spec.config_file import (ConfigLineError, interleave, load_runs, make_run_spec,
                            parse_lines)
from end2end.spec.knobs import format_knobs, parse_knobs
from end2end.results.store import COLUMNS, ResultRow, append_result, pending_runs, read_results
from slapo.errors import ConfigError
from slapo.testing import run_distributed

COMMON = ["--seq-len", "16", "--batch-size", "4", "--steps", "1", "--warmup", "1",
          "--gemm-seconds", "0.05", "--device", "cpu"]


def test_knob_text_is_canonical():
    assert parse_knobs("b=eager, a=False,c=0.5") == {"b": "eager", "a": False, "c": 0.5}
    assert format_knobs(["shard_embedding=False", "attn_kernel=eager"]) == \
        "attn_kernel=eager,shard_embedding=False"
    assert format_knobs({"fuse": True}) == format_knobs(["fuse=True"]) == "fuse=True"
    assert parse_knobs("") == {} and format_knobs([]) == ""
    for bad, match in (("fuse", "is not NAME=VALUE"), ("=1", "is not NAME=VALUE"),
                       ("a=1,a=2", "given twice")):
        with pytest.raises(ConfigError, match=match):
            parse_knobs(bad)
    with pytest.raises(ConfigError, match="may not be empty or contain commas"):
        format_knobs({"pipeline_cuts": (1, 2)})


def test_config_pragma_sets_and_resets_knobs(tmp_path):
    cfg = tmp_path / "k.cfg"
    cfg.write_text("eager tiny/bert 1 16 0 4 0\n"
                   "#@ knobs=shard_embedding=False, fuse=False\n"
                   "slapo-megatron tiny/bert 2 16 0 4 0\n"
                   "#@ knobs=\n"
                   "slapo-megatron tiny/bert 2 16 0 4 0\n")
    runs = load_runs(cfg)
    assert [r.knobs for r in runs] == ["", "fuse=False,shard_embedding=False", ""]
    assert len({r.key for r in runs}) == 3  # two knob sets of one line are two runs
    assert runs[1].cli_args()[-4:] == ["--knob", "fuse=False", "--knob", "shard_embedding=False"]


@pytest.mark.parametrize("text, match", [
    ("#@ knobs=shard_embeding=False\nslapo tiny/bert 1 16 0 4 0",
     r"k.cfg:2: .*unknown knob.*did you mean 'shard_embedding'.*valid knobs: .*attn_kernel"),
    ("#@ knobs=shard_embedding=False\neager tiny/bert 1 16 0 4 0",
     r"k.cfg:2: .*'shard_embedding' is not a knob of the baseline 'eager'.*lean_loss"),
    ("#@ knobs=lean_loss=True\nmegatron tiny/gpt2 1 16 0 4 0",
     r"k.cfg:2: .*knobs apply to the Slapo modes and the baselines eager, fsdp, deepspeed"),
    ("#@ knobs=lean_loss=1\nfsdp tiny/gpt2 1 16 0 4 0", r"k.cfg:2: .*lean_loss must be one of"),
    ("#@ knobs=sequence_parallel=True\nslapo tiny/bert 1 16 0 4 0",
     r"k.cfg:2: .*sequence_parallel is not supported by the bert schedule.*gpt2, gpt_neo, llama"),
    ("#@ knobs=ckpt_ratio=0.5\nslapo tiny/bert 1 16 0 4 0",
     r"k.cfg:2: .*'ckpt_ratio' is set by the driver.*CKPT field"),
    ("#@ knobs=fuse\nslapo tiny/bert 1 16 0 4 0", r"k.cfg:1: .*is not NAME=VALUE"),
    ("#@ knobs=fuse=maybe\nslapo tiny/bert 1 16 0 4 0", r"k.cfg:2: .*fuse must be True or False"),
])
def test_bad_knobs_in_a_config_name_the_line(text, match):
    with pytest.raises(ConfigLineError, match=match):
        parse_lines(text.splitlines(), filename="k.cfg")


def test_repeat_and_knobs_in_rows_and_keys(tmp_path):
    spec = make_run_spec("slapo", "tiny/bert", 1, 16, 0, 4, "0", knobs="fuse=False", repeat=2)
    assert spec.key[-2:] == ("fuse=False", 2) and "(repeat 2)" in spec.label
    results = tmp_path / "r.tsv"
    append_result(results, ResultRow.from_spec(spec, thrpt=1.0))
    (row,) = read_results(results).rows
    assert (row.knobs, row.repeat, row.key) == ("fuse=False", 2, spec.key)
    others = [make_run_spec("slapo", "tiny/bert", 1, 16, 0, 4, "0", repeat=r) for r in (0, 2)]
    assert pending_runs([spec, *others], results) == others
    with pytest.raises(ConfigError, match="negative"):
        make_run_spec("slapo", "tiny/bert", 1, 16, 0, 4, "0", repeat=-1)


def test_interleaved_rounds_and_resume_within_a_round(tmp_path):
    cfg = tmp_path / "r.cfg"
    cfg.write_text("eager tiny/bert 1 16 0 4 0\nslapo tiny/bert 1 16 0 4 0\n")
    runs = interleave(load_runs(cfg), 3)
    assert [(r.mode, r.repeat) for r in runs] == [
        ("eager", 0), ("slapo", 0), ("eager", 1), ("slapo", 1), ("eager", 2), ("slapo", 2)]
    results = tmp_path / "r.tsv"
    for spec in runs[:3]:  # interrupted in round 1, after its first run
        append_result(results, ResultRow.from_spec(spec, thrpt=1.0))
    assert pending_runs(runs, results) == runs[3:]
    with pytest.raises(ConfigError, match="at least 1"):
        interleave(runs, 0)


def test_results_written_before_the_new_columns_still_take_rows(tmp_path):
    old = tmp_path / "old.tsv"
    before = COLUMNS.index("Knobs")  # the columns before Knobs, Repeat and Machine existed
    header = "\t".join(COLUMNS[:before])
    old.write_text("# slapo-results v1\n" + header + "\n")
    plain = make_run_spec("eager", "tiny/bert", 1, 16, 0, 4, "0")
    append_result(old, ResultRow.from_spec(plain, thrpt=2.0))
    (row,) = read_results(old).rows
    assert row.thrpt == 2.0 and (row.knobs, row.repeat) == ("", 0)
    assert len(old.read_text().splitlines()[-1].split("\t")) == before
    knobbed = make_run_spec("slapo", "tiny/bert", 1, 16, 0, 4, "0", knobs="fuse=False")
    with pytest.raises(ConfigError, match="predates the column.*Knobs"):
        append_result(old, ResultRow.from_spec(knobbed, thrpt=1.0))


def _knob_runs(results: str):
    """On both ranks: TP=2 with and without the replicated embedding, then three bad knobs."""
    runs = [["--knob", "shard_embedding=False", "--repeat", "1"], [],
            ["--knob", "shard_embeding=False"], ["--knob", "ckpt_ratio=0.5"], ["--knob", "fuse"]]
    codes = [run_bench(parse_args(["--mode", "slapo-megatron", "--model", "tiny/bert", "--ckpt",
                                   "0", "--results", results, *extra, *COMMON]))
             for extra in runs]
    codes.append(run_bench(parse_args(["--mode", "eager", "--model", "tiny/bert", "--ckpt", "0",
                                       "--knob", "fuse=False", "--results", results,
                                       *COMMON])))
    return codes


def test_knobs_through_the_driver(tmp_path):
    results = tmp_path / "r.tsv"
    codes = run_distributed(_knob_runs, 2, str(results), timeout=300)
    assert codes[0] == [0, 0, 1, 1, 1, 1]
    rows = read_results(results).rows  # ranks write rows as they finish: find them by knobs
    by = {(r.impl, r.knobs): r for r in rows}
    assert len(rows) == len(by) == 6
    tp = {k: r for (impl, k), r in by.items() if impl == "slapo-megatron"}
    replicated, sharded = tp["shard_embedding=False"], tp[""]
    typo, driver, syntax = tp["shard_embeding=False"], tp["ckpt_ratio=0.5"], tp["fuse"]
    eager = by["eager", "fuse=False"]
    assert (replicated.knobs, replicated.repeat, replicated.status) == \
        ("shard_embedding=False", 1, "ok")
    assert (sharded.knobs, sharded.repeat, sharded.status) == ("", 0, "ok")
    # the knob reached the schedule: the replicated vocabulary is held whole on each rank
    assert replicated.per_gpu_param > sharded.per_gpu_param
    assert typo.status == "fail"
    assert "did you mean 'shard_embedding'" in typo.error and "valid knobs:" in typo.error
    assert driver.status == "fail" and "set by the driver" in driver.error
    assert syntax.status == "fail" and "NAME=VALUE" in syntax.error
    assert eager.status == "fail" and "not a knob of the baseline" in eager.error
