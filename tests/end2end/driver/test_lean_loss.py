"""The baselines' ``lean_loss=True`` knob: a HF causal LM's loss by slapo's memory-lean
cross-entropy trains exactly as HF's own loss does, under DDP and FSDP2 on two ranks, reached
from a config line; a model that is not a causal LM refuses it."""

import pytest
import torch

from end2end.driver.runner import hf_model_from_config, with_lean_loss
from slapo.errors import ConfigError
from slapo.op.cross_entropy import VocabParallelCausalLMLoss
from slapo.testing import example_inputs, run_distributed, tiny_config, tiny_model


def _losses(mode: str, lean: bool):
    from end2end.driver.runtimes import make_runner

    model = hf_model_from_config(tiny_config("gpt2", use_cache=False), 0)
    runner = make_runner(mode, with_lean_loss(model) if lean else model)
    loss_fn = getattr(runner.model, "module", runner.model).loss_function
    rank = torch.distributed.get_rank()
    torch.manual_seed(rank)  # the same dropout masks in both runs of this process
    losses = [runner.train_step(example_inputs("gpt2", batch=2, seq=16, seed=rank))
              for _ in range(3)]
    return losses, isinstance(loss_fn, VocabParallelCausalLMLoss) and loss_fn.lean


def _both():
    return {mode: [_losses(mode, lean) for lean in (False, True)] for mode in ("eager", "fsdp")}


def test_lean_loss_trains_like_hf_s_loss_under_ddp_and_fsdp2():
    for result in run_distributed(_both, 2, timeout=300):
        for mode, ((hf, hf_lean), (lean, is_lean)) in result.items():
            assert (hf_lean, is_lean) == (False, True), mode
            assert hf[2] < hf[0]
            torch.testing.assert_close(lean, hf, rtol=1e-5, atol=1e-6,
                                       msg=lambda m, mode=mode: f"{mode}: {m}")


def test_lean_loss_refuses_a_model_that_is_not_a_causal_lm():
    with pytest.raises(ConfigError, match="BertForMaskedLM is not one"):
        with_lean_loss(tiny_model("bert"))


def _built_from_a_line():
    from end2end.driver.assemble import build_runner
    from end2end.spec.config_file import expand, parse_lines
    from end2end.spec.layout import run_layout

    (spec,) = expand(parse_lines(["#@ knobs=lean_loss=True", "fsdp tiny/gpt2 2 16 0 4 0"], "t"))
    assert spec.knobs == "lean_loss=True" and "lean_loss=True" in spec.key
    runner = build_runner(spec, run_layout(spec), None, torch.device("cpu"))
    loss_fn = runner.model.loss_function
    return isinstance(loss_fn, VocabParallelCausalLMLoss) and loss_fn.lean


def test_a_config_line_carries_the_knob_to_the_runner():
    assert run_distributed(_built_from_a_line, 2) == [True, True]
