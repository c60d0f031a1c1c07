"""The simulator against the real thing: per-rank parameters of a TP schedule on a fake world
against a real 2-rank run, a line that fails for real fails in simulation with the same error,
and simulated rows never enter a measured speedup."""

from __future__ import annotations

import pytest

from end2end.results.store import ResultRow
from end2end.spec.config_file import make_run_spec

MODEL = "cpu/bert"  # h 512, 8 heads, vocab 8192: divisible by 8


def _spec(mode: str, n: int, **kw):
    return make_run_spec(mode, MODEL, n, 64, 0, 2 * n, "0", steps=1, warmup=0, dtype="fp32",
                         **kw)


def _real_parameters(n: int) -> int:
    """This rank's parameters of a real ``slapo`` run on ``n`` gloo ranks (driver code)."""
    import torch

    from end2end.driver.assemble import build_runner
    from end2end.spec.layout import run_layout
    from end2end.driver.measure import local_parameters

    spec = _spec("slapo", n)
    runner = build_runner(spec, run_layout(spec), None, torch.device("cpu"))
    runner.train_step({k: v for k, v in _batch(spec).items()})
    return local_parameters(runner.model)


def _batch(spec):
    from end2end.models import get_model_spec, make_inputs

    return make_inputs(get_model_spec(spec.model), spec.batch_size, spec.seq_len, 0)


def _fake_tp8() -> dict:
    """Rank 0 of the TP-8 run on fake tensors (in a process of its own: see
    end2end/simulate/engine/isolated.py; a fake world left in the test process corrupted its
    heap)."""
    from end2end.spec.layout import run_layout
    from end2end.simulate.engine.step import simulate_rank

    spec = _spec("slapo", 8)
    fake = simulate_rank(spec, run_layout(spec), 0)
    return {"parameters": fake.parameters,
            "groups": sorted({c.group_size for c in fake.collectives}),
            "phases": sorted({c.phase for c in fake.collectives}),
            "flops": sum(op.flops for op in fake.ops if op.phase == "forward"),
            "peak": fake.memory["peak"], "param": fake.memory["param"]}


def test_fake_tp8_parameters_and_shapes_match_a_real_tp2_run_scaled():
    from slapo.testing import run_distributed

    from end2end.driver.measure import local_parameters
    from end2end.models import build_model
    from end2end.simulate.engine.isolated import isolated

    one = local_parameters(build_model(MODEL, device="meta"))  # the unsharded model
    two = run_distributed(_real_parameters, 2, 2)
    two = two[0] if isinstance(two, list) else two
    sharded = 2 * (one - two)  # P = R + S, P2 = R + S / 2
    replicated = one - sharded
    fake = isolated("tests.end2end.simulate.test_simulate._fake_tp8")
    assert fake["parameters"] == replicated + sharded // 8
    # the TP schedule's collectives: all over the 8-rank group, forward and backward
    assert fake["groups"] == [8]
    assert {"forward", "backward"} <= set(fake["phases"])
    assert fake["flops"] > 0 and fake["peak"] > fake["param"] > 0


def _refused_run(results: str) -> int:
    from end2end.driver.bench import main as bench_main

    return bench_main(["--mode", "eager", "--model", MODEL, "--seq-len", "64",
                       "--dec-seq-len", "0", "--batch-size", "4", "--ckpt", "0", "--pp", "2",
                       "--steps", "1", "--warmup", "0", "--results", results])


def _simulated_refusal() -> dict:
    from end2end.simulate.cost.profiles import get_profile
    from end2end.simulate.engine.run import simulate_in_process

    spec = make_run_spec("eager", MODEL, 2, 64, 0, 4, "0", steps=1, warmup=0, pp=2)
    return simulate_in_process(spec, get_profile("v100-32gb"))


def test_a_line_refused_for_real_is_the_same_fail_row_in_simulation(tmp_path):
    from slapo.testing import run_distributed

    from end2end.results.store import read_results
    from end2end.simulate.engine.isolated import isolated

    real = tmp_path / "real.tsv"
    assert 1 in run_distributed(_refused_run, 2, str(real))
    real_row = read_results(real).rows[0]
    sim = isolated("tests.end2end.simulate.test_simulate._simulated_refusal")
    assert sim["status"] == real_row.status == "fail"
    # the same error; the rank prefix is whichever rank of the real job wrote first
    assert sim["error"].split(": ", 1)[1] == real_row.error.split(": ", 1)[1]


def _row(impl: str, thrpt: float, status: str = "ok", device: str = "cpu") -> ResultRow:
    return ResultRow(impl, MODEL, 64, 0, 2, 4, "0", thrpt=thrpt, status=status, device=device,
                     error="" if status in ("ok", "sim") else "x")


def test_simulated_rows_never_enter_a_measured_speedup():
    from end2end.results.summary import PlotError, figure7_table, is_predicted, speedups

    measured = [_row("eager", 10.0), _row("slapo", 12.0)]
    predicted = [_row("eager", 5.0, "sim", "v100-32gb (simulated)"),
                 _row("slapo", 20.0, "sim", "v100-32gb (simulated)")]
    with pytest.raises(PlotError, match="mix simulated"):
        figure7_table([measured[0], predicted[1]])
    assert not is_predicted(measured) and is_predicted(predicted)
    ratio = [s.ratio.value for s in speedups(figure7_table(predicted)) if s.system == "slapo"]
    assert ratio == [4.0]  # predicted / predicted only
    ratio = [s.ratio.value for s in speedups(figure7_table(measured)) if s.system == "slapo"]
    assert ratio == [1.2]


def test_a_figure_of_simulated_rows_marks_every_legend_entry_predicted():
    from end2end.results.plot import make_figure
    from end2end.results.summary import figure7_table

    predicted = [_row("eager", 5.0, "sim", "v100-32gb (simulated)"),
                 _row("slapo", 20.0, "sim", "v100-32gb (simulated)")]
    measured = [_row("eager", 10.0), _row("slapo", 12.0)]
    for rows, marked in ((predicted, True), (measured, False)):
        fig = make_figure(figure7_table(rows), predicted=marked)
        texts = [t.get_text() for t in fig.legends[0].get_texts()]
        systems = [t for t in texts if t not in ("OOM / failed", "not run")]
        assert systems and all(t.endswith("(predicted)") == marked for t in systems), texts
