"""Config grammar, the safe BATCH_SIZE evaluator and run expansion (end2end/spec/config_file.py)."""

import warnings
from pathlib import Path

import pytest

from end2end.spec.config_file import (ConfigLineError, ConfigWarning, RunSpec, expand, load_runs,
                            make_run_spec, parse_lines)
from end2end.spec.expr import ExprError, check_expression, evaluate_batch_size
from slapo.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[3] / "end2end" / "configs"


@pytest.mark.parametrize("expr,n,expected", [
    ("16*n", 4, 64), ("min(8*n, 48)", 8, 48), ("3 if n==2 else n+2", 2, 3),
    ("3 if n==2 else n+2", 4, 6), ("2 if n==2 else 5 if n==4 else 10", 8, 10),
    ("min(32, 1 if n<=2 else 5*n)", 4, 20), ("8*int(log2(n)+1)", 4, 24),
    ("int(math.ceil(n / 3))", 4, 2), ("n**2 // 2", 4, 8), ("-(-n // 3)", 4, 2),
    ("max(n, 4) if n > 1 and not n == 3 else 1", 2, 4), ("48/2", 1, 24), ("abs(-n)", 2, 2),
])
def test_batch_expressions(expr, n, expected):
    check_expression(expr)
    assert evaluate_batch_size(expr, n) == expected


@pytest.mark.parametrize("expr,match", [
    ("__import__('os')", "calling '__import__'"),
    ("n.__class__", "attribute access"),
    ("(lambda: 1)()", "calling"),
    ("9**9**9", "exponent"),
    ("open('x')", "calling 'open'"),
    ("m * 2", "unknown name 'm'"),
    ("[n for n in range(3)][0]", "not allowed"),
    ("math.pi", "not allowed"),
    ("min(n, key=abs)", "keyword"),
    ("'a' * 3", "not a number"),
    ("10**15 * 10**15", "exceeds"),
    ("n / 0", "division by zero"),
    ("n / 3", "not an integer"),
    ("n - 9", "must be >= 1"),
    ("n +", "syntax error"),
    ("", "empty"),
])
def test_malicious_or_invalid_expressions_rejected(expr, match):
    with pytest.raises(ExprError, match=match):
        evaluate_batch_size(expr, 4)


def test_static_check_sees_untaken_branches():
    with pytest.raises(ExprError, match="unknown name 'os'"):
        check_expression("1 if n else os")
    assert issubclass(ExprError, ConfigError)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.cfg")), ids=lambda p: p.name)
def test_every_shipped_line_parses(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        runs = load_runs(path, max_devices=64)
    assert runs and all(isinstance(r, RunSpec) and r.batch_size >= 1 for r in runs)
    assert len({r.key for r in runs}) == len(runs)


def test_asplos24_matrix_is_complete():
    runs = load_runs(CONFIGS / "single_node_asplos24.cfg")
    assert len(runs) == 63
    cells = {(r.mode, r.model, r.n) for r in runs}
    assert len(cells) == 63 and {r.n for r in runs} == {2, 4, 8}
    megatron_models = {r.model for r in runs if r.mode == "megatron"}
    assert megatron_models == {"bert-xlarge", "EleutherAI/gpt-neo-2.7B", "t5-3b"}
    gpt2 = next(r for r in runs if (r.mode, r.model, r.n) ==
                ("megatron", "EleutherAI/gpt-neo-2.7B", 2))
    assert (gpt2.batch_size, gpt2.ckpt, gpt2.recompute_granularity) == (6, "full", "full")
    assert all(r.steps == 40 and r.dtype == "fp16" for r in runs)


def test_cpu_config_covers_figure7_models_on_two_ranks():
    runs = load_runs(CONFIGS / "cpu.cfg")
    assert {r.model for r in runs} == {"cpu/bert", "cpu/roberta", "cpu/gpt-neo", "cpu/opt",
                                       "cpu/t5", "cpu/wideresnet"}
    assert {r.n for r in runs} == {1, 2} and {r.dtype for r in runs} == {"fp32"}


def test_expansion_keys_and_options():
    text = ['#@ steps=7 warmup=1 dtype=bf16',
            'slapo bert-large-uncased 1,2 128 0 "min(4*n, 6)" 0.5  # trailing comment',
            '', '# slapo bert-large-uncased 1 128 0 4 0',
            "deepspeed t5-base pow2 128 64 '2*n' full"]
    runs = expand(parse_lines(text, "t.cfg"), max_devices=5)
    assert [(r.mode, r.n, r.batch_size, r.ckpt) for r in runs] == [
        ("slapo", 1, 4, "0.5"), ("slapo", 2, 6, "0.5"), ("deepspeed", 1, 2, "1"),
        ("deepspeed", 2, 4, "1"), ("deepspeed", 4, 8, "1")]
    assert runs[0].key == ("slapo", "bert-large-uncased", 128, 0, 1, 4, "0.5", "", "", 0)
    assert runs[0].source == "t.cfg:2" and runs[0].steps == 7 and runs[0].dtype == "bf16"
    assert runs[0].cli_args()[:4] == ["--mode", "slapo", "--model", "bert-large-uncased"]
    assert runs[2].parallel_sizes == (1, 1, 1) and runs[4].parallel_sizes == (1, 1, 4)
    assert runs[0].ckpt_ratio == 0.5 and runs[2].ckpt_ratio == 1.0


def test_pow2_needs_device_count():
    lines = parse_lines(["slapo bert-base-uncased pow2 128 0 4 0"], "p.cfg")
    with pytest.raises(ConfigLineError, match=r"p.cfg:1: .*pow2.*max_devices"):
        expand(lines)


def test_duplicates_dropped_with_warning():
    lines = parse_lines(["slapo bert-base-uncased 2 128 0 4 1.0",
                         "slapo bert-base-uncased 2 128 0 4 1"], "d.cfg")
    with pytest.warns(ConfigWarning, match="d.cfg:2: duplicate of d.cfg:1"):
        assert len(expand(lines)) == 1


def test_megatron_ckpt_one_quirk():
    with pytest.warns(ConfigWarning, match="q.cfg:1: megatron CKPT '1' read as 'full'"):
        (line,) = parse_lines(["megatron gpt2 2 1024 0 8 1"], "q.cfg")
    assert line.ckpt == "full"
    with pytest.raises(ConfigLineError, match="q.cfg:1: CKPT '1' is not valid"):
        parse_lines(["megatron gpt2 2 1024 0 8 1"], "q.cfg", strict=True)


@pytest.mark.parametrize("line,match", [
    ("slapo bert-base-uncased 2 128 0 4", "expected 7 fields"),
    ("torchscript bert-base-uncased 1 128 0 4 0", "unknown MODE 'torchscript'.*deprecated"),
    ("slapo bert-bas-uncased 1 128 0 4 0", "unknown model 'bert-bas-uncased'.*did you mean"),
    ("slapo bert-base-uncased 0 128 0 4 0", "GPUS '0' contains 0"),
    ("slapo bert-base-uncased two 128 0 4 0", "GPUS 'two'"),
    ("slapo bert-base-uncased 1 1024 0 4 0", "exceeds the 512 positions"),
    ("slapo t5-base 1 512 0 4 0", "DEC_SEQ_LEN is 0"),
    ("slapo gpt2 1 512 64 4 0", "DEC_SEQ_LEN 64 given"),
    ("slapo gpt2 1 512 0 4 1.5", "outside"),
    ("slapo gpt2 1 512 0 4 selective", "not valid for mode 'slapo'"),
    ("deepspeed gpt2 1 512 0 4 0.5", "not valid for mode 'deepspeed'"),
    ("megatron gpt2 1 512 0 4 0.5", "not valid for mode 'megatron'"),
    ("slapo gpt2 1 512 0 '__import__(\"os\")' 0", "'__import__'"),
    ("slapo gpt2 2 512 0 'n - 2' 0", "evaluates to 0 for n=2"),
    ("slapo gpt2 1 512 0 \"4 0", "cannot split"),
])
def test_bad_lines_report_file_and_line(line, match):
    with pytest.raises(ConfigLineError, match=r"^bad.cfg:3: (.*)?" + match):
        parse_lines(["# header", "", line], "bad.cfg")


def test_bad_option_pragma():
    with pytest.raises(ConfigLineError, match="o.cfg:1: unknown option 'stepz=3'"):
        parse_lines(["#@ stepz=3"], "o.cfg")
    with pytest.raises(ConfigLineError, match="tp=2 x pp=1 does not divide n=3"):
        expand(parse_lines(["#@ tp=2", "slapo gpt2 3 128 0 6 0"], "o.cfg"))


def test_missing_file():
    with pytest.raises(ConfigError, match="cannot read config"):
        load_runs("/nonexistent/x.cfg")


def test_make_run_spec_for_the_driver():
    spec = make_run_spec("slapo-deepspeed", "cpu/gpt-neo", 2, 256, 0, 4, "1.0", steps=8,
                         dtype=None)
    assert spec.key == ("slapo-deepspeed", "cpu/gpt-neo", 256, 0, 2, 4, "1", "", "", 0)
    assert spec.steps == 8 and spec.dtype is None and spec.parallel_sizes == (1, 1, 2)
    assert spec.cli_args()[-2:] == ["--steps", "8"]
    with pytest.raises(ConfigLineError, match="<command line>:1: .*not valid for mode 'eager'"):
        make_run_spec("eager", "cpu/bert", 1, 128, 0, 4, "0.5")


def test_save_every_and_resume_pragmas_reach_the_driver():
    text = ["#@ save_every=2 resume=results/r.tsv.state", "slapo gpt2 1 128 0 4 0",
            "#@ reset", "slapo gpt2 2 128 0 4 0"]
    first, second = expand(parse_lines(text, "s.cfg"))
    assert (first.save_every, first.resume) == (2, "results/r.tsv.state")
    args = first.cli_args()
    assert args[args.index("--save-every") + 1] == "2"
    assert args[args.index("--resume") + 1] == "results/r.tsv.state"
    assert "--save-every" not in second.cli_args() and "--resume" not in second.cli_args()
    assert first.key == make_run_spec("slapo", "gpt2", 1, 128, 0, 4, "0").key  # not in the key
    assert RunSpec.from_json(first.to_json()) == first and RunSpec.from_json(
        first.to_json()).resume == first.resume
    with pytest.raises(ConfigLineError, match="s.cfg:1: save_every is 0"):
        parse_lines(["#@ save_every=0"], "s.cfg")
    with pytest.raises(ConfigLineError, match="s.cfg:1: resume= names no directory"):
        parse_lines(["#@ resume="], "s.cfg")


def test_fp32_masters_option_reaches_the_driver_or_is_refused_with_the_line():
    text = ["#@ dtype=fp16 fp32_masters=1", "eager gpt2 1 128 0 4 0", "deepspeed gpt2 2 128 0 4 0",
            "#@ fp32_masters=0", "slapo gpt2 2 128 0 4 0"]
    eager, deepspeed, slapo = expand(parse_lines(text, "m.cfg"))
    assert eager.fp32_masters and deepspeed.fp32_masters and slapo.fp32_masters is False
    assert "--fp32-masters" in eager.cli_args() and "--fp32-masters" not in slapo.cli_args()
    assert eager.key == make_run_spec("eager", "gpt2", 1, 128, 0, 4, "0").key  # not in the key
    assert RunSpec.from_json(eager.to_json()).fp32_masters is True
    from end2end.driver.bench import parse_args, spec_from_args

    args = parse_args(["--mode", "eager", "--model", "gpt2", "--seq-len", "128",
                       "--batch-size", "4", "--ckpt", "0", "--results", "r.tsv",
                       *eager.cli_args()[-3:]])
    assert spec_from_args(args, 1).fp32_masters is True
    for lines, match in (
            (["#@ fp32_masters=yes"], "m.cfg:1: fp32_masters='yes' is not a flag"),
            (["#@ fp32_masters=1", "eager gpt2 1 128 0 4 0"],
             "m.cfg:2: fp32_masters=1 in an fp32 run"),
            (["#@ dtype=bf16 fp32_masters=1", "dtensor-tp llama 2 128 0 4 0"],
             "m.cfg:2: fp32_masters: mode 'dtensor-tp' trains the model cast"),
            (["#@ dtype=bf16 fp32_masters=1 pp=2", "slapo gpt2 2 128 0 4 0"],
             "m.cfg:2: fp32_masters: the torch pipeline of mode 'slapo'")):
        with pytest.raises(ConfigLineError, match=match):
            expand(parse_lines(lines, "m.cfg"))
