"""Gradient accumulation without a pipeline (``--micro-batch-size`` below the rank's batch, in
every mode): a step over M micro-batches trains exactly as the step over the whole batch, on 1
and 2 gloo ranks: the same losses over three SGD steps (SGD: a gradient of the wrong scale
shows; AdamW would hide it) and, where the runtime keeps them, the same gradients; from a
config line through the driver's layout too."""

import pytest
import torch
import torch.distributed as dist

from end2end.driver.builders import micro_batches
from slapo.testing import example_inputs, run_distributed, tiny_config

STEPS = 3
MODES_1 = (("eager", "gpt2"), ("fsdp", "gpt2"), ("deepspeed", "gpt2"))
MODES_2 = MODES_1 + (("slapo", "gpt2"), ("slapo-fsdp", "llama"), ("dtensor-tp", "llama"),
                     ("hf-tp", "llama"), ("slapo-deepspeed", "gpt2"))


def _sgd(params):
    return torch.optim.SGD(params, lr=0.5)


def _grads(runner):
    if runner.mode.endswith("deepspeed"):  # ZeRO-3 keeps no whole gradient: losses only
        return []
    grads = [p.grad for p in runner.model.parameters() if p.grad is not None]
    return [g.full_tensor() if hasattr(g, "full_tensor") else g for g in grads]


def _run(mode, family, microbatches):
    from end2end.driver.runner import ModelSchedule
    from end2end.driver.runtimes import make_runner
    from end2end.driver.runner import default_deepspeed_config

    schedule = ModelSchedule(family) if mode.startswith("slapo") else None
    runner = make_runner(mode, tiny_config(family, use_cache=False), schedule=schedule,
                         optimizer=_sgd, num_microbatches=microbatches,
                         deepspeed_config=default_deepspeed_config(4 // microbatches,
                                                                   microbatches))
    batch = example_inputs(family, batch=4, seq=8, seed=dist.get_rank())  # one per rank
    try:
        losses = [runner.train_step(batch) for _ in range(STEPS)]
        return losses, _grads(runner)
    finally:
        runner.close()


def _all(modes):
    return {(mode, family): [_run(mode, family, m) for m in (1, 2, 4)]
            for mode, family in modes}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world,modes", [(1, MODES_1), (2, MODES_2)])
def test_accumulated_steps_train_as_the_whole_batch(world, modes):
    for result in run_distributed(_all, world, modes, timeout=850):
        for (mode, _), ((whole, g_whole), *accumulated) in result.items():
            assert whole[-1] < whole[0], (mode, whole)  # it trains
            for m, (losses, grads) in zip((2, 4), accumulated):
                torch.testing.assert_close(losses, whole, rtol=1e-5, atol=1e-6,
                                           msg=lambda e, k=(mode, m): f"{k}: {e}")
                assert len(grads) == len(g_whole), (mode, m)
                for a, b in zip(grads, g_whole):  # fp32 sums in another order, 3 steps on
                    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5,
                                               msg=lambda e, k=(mode, m): f"{k}: {e}")


def test_micro_batches_cut_every_input_along_the_batch():
    batch = dict(input_ids=torch.arange(12).view(4, 3), labels=torch.arange(12).view(4, 3))
    parts = micro_batches(batch, 2)
    assert [p["input_ids"].tolist() for p in parts] == [[[0, 1, 2], [3, 4, 5]],
                                                       [[6, 7, 8], [9, 10, 11]]]
    assert micro_batches(batch, 1) == [batch]


def _from_a_line():
    from end2end.driver.assemble import build_runner, rank_batch
    from end2end.spec.config_file import expand, parse_lines
    from end2end.spec.layout import run_layout

    out = []  # tiny/llama: no dropout, so the two steps draw nothing that differs
    for pragma in ("#@ reset", "#@ micro_batch=1"):
        (spec,) = expand(parse_lines([pragma, "fsdp tiny/llama 2 8 0 4 0"], "t"))
        layout = run_layout(spec)
        runner = build_runner(spec, layout, None, torch.device("cpu"))
        batch = rank_batch(spec, layout, dist.get_rank(), torch.device("cpu"), None)
        out.append((layout.num_microbatches, [runner.train_step(batch) for _ in range(2)]))
        runner.close()
    return out


def test_a_config_line_accumulates_through_the_driver_s_layout():
    for (m_whole, whole), (m_acc, acc) in run_distributed(_from_a_line, 2):
        assert (m_whole, m_acc) == (1, 2)
        torch.testing.assert_close(acc, whole, rtol=1e-5, atol=1e-6)
