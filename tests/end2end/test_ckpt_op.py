"""CKPT ``op`` (every layer checkpointed selectively, torchtitan's selective "op" activation
checkpointing) from the config line to the driver and the simulator: parsed where the ratio is,
refused with the line where it cannot apply, given to the recipe as ``ckpt_ratio=1`` with
``ckpt_policy``, trained by the driver (the same loss as without checkpointing, one ``ok`` row
per mode), and simulated on fake tensors with an activation peak between no checkpointing and
whole-layer checkpointing."""

from __future__ import annotations

import pytest

from end2end.spec.config_file import ConfigLineError, expand, make_run_spec, parse_lines
from end2end.spec.modes import MODE_TABLE

RATIO_MODES = [m.name for m in MODE_TABLE.values() if m.ckpt == "ratio"]
OTHER_MODES = [m.name for m in MODE_TABLE.values() if m.ckpt != "ratio"]


@pytest.mark.parametrize("mode", RATIO_MODES)
def test_op_is_a_ckpt_of_every_ratio_mode(mode):
    (line,) = parse_lines([f"{mode} tiny/llama 2 16 0 4 OP"], "c.cfg")
    assert line.ckpt == "op"
    (spec,) = expand([line])
    assert (spec.ckpt, spec.ckpt_ratio, spec.ckpt_policy) == ("op", 1.0,
                                                               "save_every_other_matmul")
    assert make_run_spec(mode, "tiny/llama", 2, 16, 0, 4, "op").key == spec.key


def test_a_ratio_has_no_policy():
    spec = make_run_spec("slapo", "tiny/llama", 2, 16, 0, 4, "0.5")
    assert (spec.ckpt_ratio, spec.ckpt_policy) == (0.5, "")


@pytest.mark.parametrize("text,match", [
    *[(f"{mode} tiny/llama 2 16 0 4 op", r"c.cfg:1: CKPT 'op' is not valid for mode") for mode
      in OTHER_MODES],
    ("slapo tiny/wideresnet 1 1 0 4 op", r"c.cfg:1: CKPT 'op' is not available for "
                                         r"tiny/wideresnet\. Hint: a convolutional network"),
    ("slapo tiny/llama 2 16 0 4 ops", r"c.cfg:1: CKPT 'ops' is not valid.*Hint: .*or op"),
    ("#@ knobs=ckpt_policy=save_matmuls\nslapo tiny/llama 2 16 0 4 1",
     r"c.cfg:2: .*'ckpt_policy' is set by the driver.*CKPT field"),
])
def test_op_where_it_cannot_apply_names_the_line(text, match):
    with pytest.raises(ConfigLineError, match=match):
        parse_lines(text.splitlines(), "c.cfg")


# ------------------------------------------------------------------------- the driver, 2 ranks
def _driver(results: str):
    """On each rank: the layers' checkpoint policies of a ``slapo-fsdp`` run with CKPT op, its
    losses over two steps and those of CKPT 0 (the second after an AdamW step on the first's
    gradients), then the exit codes of two driver runs with CKPT op."""
    import torch

    from end2end.driver.assemble import build_runner, rank_batch
    from end2end.driver.bench import parse_args, run_bench
    from end2end.spec.layout import run_layout
    from slapo.runtime.distributed import init_distributed
    from slapo.runtime.forward_wrap import forward_wrappers

    torch.set_num_threads(1)
    env = init_distributed()
    policies, losses = [], []
    for ckpt in ("op", "0"):
        spec = make_run_spec("slapo-fsdp", "tiny/llama", 2, 16, 0, 4, ckpt, steps=1, warmup=0)
        layout = run_layout(spec)
        runner = build_runner(spec, layout, None, env.device)
        if ckpt == "op":
            policies = [forward_wrappers(m)["checkpoint"].policy for m in runner.model.modules()
                        if "checkpoint" in forward_wrappers(m)]
        batch = rank_batch(spec, layout, env.rank, env.device, None)
        losses.append([runner.train_step(batch) for _ in range(2)])
        runner.close()
    common = ["--model", "tiny/llama", "--seq-len", "16", "--batch-size", "4", "--ckpt", "op",
              "--steps", "1", "--warmup", "0", "--gemm-seconds", "0.05", "--device", "cpu",
              "--results", results]
    codes = [run_bench(parse_args(["--mode", mode, *common])) for mode in ("slapo", "slapo-fsdp")]
    return [repr(p) for p in policies], losses, codes


def test_driver_trains_ckpt_op(tmp_path):
    from end2end.models import get_model_spec
    from end2end.results.store import read_results
    from slapo.runtime.checkpoint_policy import POLICIES
    from slapo.testing import run_distributed

    results = tmp_path / "r.tsv"
    out = run_distributed(_driver, 2, str(results), timeout=600)
    layers = get_model_spec("tiny/llama").layers
    for policies, losses, codes in out:
        assert policies == [repr(POLICIES["save_every_other_matmul"])] * layers
        assert losses[0] == pytest.approx(losses[1], rel=1e-5)
        assert losses[0][0] != losses[0][1]  # the second step saw the first's update
        assert codes == [0, 0]
    rows = read_results(results).rows
    assert [(r.impl, r.ckpt, r.status) for r in rows] == [("slapo", "op", "ok"),
                                                           ("slapo-fsdp", "op", "ok")]


# ---------------------------------------------------------------------------- the simulator
def simulated_memory(ckpt: str) -> dict:
    """Rank 0's simulated memory (bytes by kind) of ``slapo-fsdp tiny/llama 2 64 0 4 CKPT``
    (called in a fresh process: :func:`end2end.simulate.engine.isolated.isolated`)."""
    from end2end.simulate.cost.profiles import get_profile
    from end2end.simulate.engine.run import simulate_in_process

    spec = make_run_spec("slapo-fsdp", "tiny/llama", 2, 64, 0, 4, ckpt, steps=1, warmup=0)
    row = simulate_in_process(spec, get_profile("v100-32gb"))
    assert row["status"] == "sim", row.get("error")
    return row["extra"]["memory"][0]


def test_simulator_runs_ckpt_op_between_none_and_full():
    from end2end.simulate.engine.isolated import isolated

    fn = "tests.end2end.test_ckpt_op.simulated_memory"
    none, op, full = (isolated(fn, ckpt) for ckpt in ("0", "op", "1"))
    assert none["activation"] > op["activation"] > full["activation"], (none, op, full)
