"""A run with ``fp32_masters`` simulated as its driver trains it (plain PyTorch with megatron-core's
mixed-precision optimizer): its states are the fp32 masters and fp32 moments (12 bytes per
parameter where the cast model's AdamW keeps 4), and the optimizer's whole step (the gradients
cast to fp32 and unscaled, the inner AdamW, the masters copied back into the model in one
multi-tensor copy in fp16, one copy per tensor in bf16) is the step's ``optimizer`` phase."""

import collections

import pytest

from end2end.simulate.engine.isolated import isolated


def simulated(mode: str, dtype: str, masters: bool) -> dict:
    """A ``tiny/gpt2`` step simulated on a V100 profile: optimizer states per parameter and the
    ops per phase by name."""
    from end2end.simulate.engine.step import simulate_rank
    from end2end.spec.config_file import make_run_spec
    from end2end.spec.layout import run_layout

    spec = make_run_spec(mode, "tiny/gpt2", 1, 32, 0, 2, "0", steps=1, warmup=0, dtype=dtype,
                         fp32_masters=masters or None)
    result = simulate_rank(spec, run_layout(spec), 0, gpu=(7, 0))
    ops = collections.defaultdict(collections.Counter)
    for op in result.ops:
        ops[op.phase][op.name] += op.weight
    return dict(state_per_param=result.memory["optstate"] / result.parameters,
                ops={phase: dict(names) for phase, names in ops.items()})


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_fp32_masters_are_simulated_as_the_driver_keeps_them(dtype):
    cast = isolated("tests.end2end.simulate.test_fp32_masters.simulated", "eager", dtype, False)
    mixed = isolated("tests.end2end.simulate.test_fp32_masters.simulated", "eager", dtype, True)
    assert cast["state_per_param"] == pytest.approx(4, rel=0.01), cast
    assert mixed["state_per_param"] == pytest.approx(12, rel=0.01), mixed
    optimizer, outside = mixed["ops"]["optimizer"], mixed["ops"]["forward"]
    # fp16 unscales (and checks) the gradients in one multi-tensor op; bf16 has no loss scale
    unscaled = optimizer.get("_amp_foreach_non_finite_check_and_unscale_", 0)
    assert unscaled == (1 if dtype == "fp16" else 0), optimizer
    assert optimizer.get("_to_copy", 0) > 10, optimizer  # the gradients cast, tensor by tensor
    if dtype == "fp16":  # the masters back into the model: one multi-tensor copy
        assert optimizer.get("_foreach_copy_") == 1 and "copy_" not in optimizer, optimizer
    else:
        assert optimizer.get("copy_", 0) > 10 and "_foreach_copy_" not in optimizer, optimizer
    # nothing of the optimizer's step is left in the forward phase: its casts and copies are
    # the cast model's
    for name in ("_to_copy", "copy_", "_foreach_copy_"):
        assert outside.get(name, 0) == cast["ops"]["forward"].get(name, 0), (name, outside)
