"""The public build of a pipeline stage's schedule ahead of the first step
(:meth:`PipelineRunner.prepare`, :meth:`PipelineModel.prepare`) builds the schedule the first
training step would: on 2 gloo ranks, a 2-stage tiny GPT-2 (dropout on) trained after an early
build gives exactly the losses, gradients and weights of one that builds lazily in its first
step, the build happens once, and bad batches are refused with a clear error."""

from typing import Any, Dict, List

import pytest
import torch
import torch.distributed as dist

import slapo
from slapo.pipeline import PipelineRunner, build_pipeline_stages
from slapo.testing import example_inputs, run_distributed, tiny_model

pytestmark = pytest.mark.timeout(300)


def _schedule():
    model = tiny_model("gpt2", n_layer=4, use_cache=False, resid_pdrop=0.2, embd_pdrop=0.2,
                       attn_pdrop=0.2)
    sch = slapo.create_schedule(model)
    sch.trace_until("transformer", example_inputs=example_inputs("gpt2", batch=4))
    sch["transformer.h.1"].cut_pipeline_stage()
    return sch


def _batch(step: int) -> Dict[str, torch.Tensor]:
    return example_inputs("gpt2", batch=4, seq=8, seed=step)


def _runner_steps(early: bool) -> Dict[str, Any]:
    """Two SGD steps of this rank's stage through PipelineRunner, the schedule built by
    ``prepare`` before the first step (``early``) or lazily by it."""
    stages = build_pipeline_stages(_schedule())
    rank = dist.get_rank()
    runner = PipelineRunner(stages, n_microbatches=2, schedule="1f1b")
    opt = torch.optim.SGD(stages[rank].parameters(), lr=0.1)
    out: Dict[str, Any] = dict(before=runner.schedule is None, losses=[])
    torch.manual_seed(1234)  # dropout: the build's example pass draws as in the first step
    if early:
        built = runner.prepare(_batch(0))
        out["same_object"] = (built is runner.schedule
                              and runner.prepare(_batch(1)) is built)  # built once
    for step in range(2):
        opt.zero_grad(set_to_none=True)
        loss = runner.step(_batch(step))
        if step == 0:
            out["grads"] = {n: p.grad.clone() for n, p in stages[rank].named_parameters()}
            out["built"] = runner.schedule
        out["losses"].append(None if loss is None else loss.item())
        opt.step()
    out["kind"] = type(runner.schedule).__name__
    out["kept"] = runner.schedule is out.pop("built")
    out["weights"] = {n: p.detach().clone() for n, p in stages[rank].named_parameters()}
    return out


def _model_steps(early: bool) -> List[float]:
    """Two steps of ``slapo.build``'s PipelineModel; ``early``: ``prepare`` first, from eval
    mode (the build must still run as the training step runs it)."""
    model, _ = slapo.build(_schedule(), optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                           n_microbatches=2, pipeline_schedule="gpipe")
    torch.manual_seed(99)
    if early:
        model.eval()
        model.prepare(_batch(0))
    return [model.train_step(_batch(s)) for s in range(2)]


def _errors() -> Dict[str, str]:
    stages = build_pipeline_stages(_schedule())
    runner = PipelineRunner(stages, n_microbatches=2)
    model, _ = slapo.build(_schedule(), n_microbatches=2)
    out = {}
    for name, call in (("runner", lambda: runner.prepare(example_inputs("gpt2", batch=3))),
                       ("model", lambda: model.prepare(example_inputs("gpt2", batch=3)))):
        try:
            call()
            out[name] = "no error"
        except slapo.SlapoError as e:
            out[name] = f"{type(e).__name__}: {e}"
    out["unbuilt"] = str(runner.schedule is None and model.runner.schedule is None)
    return out


def _all() -> Dict[str, Any]:
    return dict(lazy=_runner_steps(False), early=_runner_steps(True),
                model_lazy=_model_steps(False), model_early=_model_steps(True),
                errors=_errors())


def test_prepare_builds_the_schedule_the_first_step_would():
    for rank, res in enumerate(run_distributed(_all, 2, timeout=280)):
        lazy, early = res["lazy"], res["early"]
        assert lazy["before"] and early["before"]
        assert early["same_object"] and early["kept"] and lazy["kept"]
        assert early["kind"] == lazy["kind"] == "Schedule1F1B"
        assert early["losses"] == lazy["losses"]
        assert (early["losses"][0] is None) == (rank == 0)
        assert early["grads"].keys() == lazy["grads"].keys() and early["grads"]
        for name, grad in lazy["grads"].items():
            torch.testing.assert_close(early["grads"][name], grad, rtol=0, atol=0, msg=name)
        for name, w in lazy["weights"].items():
            torch.testing.assert_close(early["weights"][name], w, rtol=0, atol=0, msg=name)
        assert res["model_early"] == res["model_lazy"]
        assert len(set(res["model_lazy"])) == 2  # two different steps, the same on both ranks
        errors = res["errors"]
        assert errors["runner"].startswith("PipelineError") and "into 2 micro-batches" in \
            errors["runner"] and "multiple of 2" in errors["runner"]
        assert errors["model"].startswith("ConfigError") and "micro-batches" in errors["model"]
        assert errors["unbuilt"] == "True"
