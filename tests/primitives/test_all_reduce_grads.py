"""``all_reduce_grads`` and the gradient hooks ``mark_replicated`` installs through it: replicated
parameters' gradients are complete after backward with no call in the training loop, through
``slapo.build`` (also from meta weights) and the end2end driver; a parameter tagged by hand is
still reduced by ``reduce_replicated_grads``, exactly once; fsdp keeps the hooks
(numerically: tests/dialects/test_fsdp.py)."""

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

import slapo
from slapo.errors import ConfigError
from slapo.sharding import mark_replicated, reduce_replicated_grads
from slapo.sharding.grad_all_reduce import GRAD_ALL_REDUCE_TAG, grad_hook_installed
from slapo.testing import example_inputs, run_distributed, tiny_model
from tests.sharding.test_sequence_parallel import _llama

STEPS, LR = 3, 0.1


def _sgd(params):
    return torch.optim.SGD(params, lr=LR)


def _replicated(model: nn.Module):
    return {n: p for n, p in model.named_parameters() if getattr(p, "replicated_param", False)}


def _same_on_all_ranks(tensors) -> int:
    """Every tensor equals rank 0's (bit for bit); returns how many were compared."""
    differ = []
    for name, t in tensors.items():  # the same collectives on every rank, then the verdict
        ref = t.detach().clone()
        dist.broadcast(ref, src=0)
        if not torch.equal(t.detach(), ref):
            differ.append(name)
    assert not differ, f"differ from rank 0's: {differ}"
    assert tensors, "nothing compared"
    return len(tensors)


def _train(model, opt, batch, steps=STEPS):
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()  # no reduce_replicated_grads: the schedule's hooks do it
        opt.step()
        losses.append(loss.item())
    return losses


def _reference(batch, meta=False):
    ref = _meta_llama() if meta else tiny_model("llama", use_cache=False)
    if meta:
        ref, _ = slapo.build(slapo.create_schedule(ref), init_weights=True)
    return ref, _train(ref, _sgd(ref.parameters()), batch)


def _meta_llama():
    with slapo.init_empty_weights():
        return tiny_model("llama", use_cache=False)


def sp_llama_through_build(meta: bool):
    """Sequence-parallel LLaMA via slapo.build and a plain loop == the unscheduled model."""
    batch = example_inputs("llama")
    ref, ref_losses = _reference(batch, meta)
    model = _meta_llama() if meta else tiny_model("llama", use_cache=False)
    sch = slapo.create_schedule(model)
    _llama(sch)
    assert "all_reduce_grads" in sch.history.to_code()
    built, opt = slapo.build(sch, target="torch", optimizer=_sgd,
                             **({"init_weights": True} if meta else {}))
    replicated = _replicated(built)
    assert replicated and all(grad_hook_installed(p) for p in replicated.values())
    losses = _train(built, opt, batch)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)
    ref_params = dict(ref.named_parameters())
    for name, p in replicated.items():
        torch.testing.assert_close(p.detach(), ref_params[name].detach(), rtol=1e-5,
                                   atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    return _same_on_all_ranks(replicated)


def hand_tagged_reduced_once():
    """A hand-tagged parameter is summed once by reduce_replicated_grads; a mark_replicated one
    once by its hook (a second reduce_replicated_grads call leaves it alone)."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 1))
    model = copy.deepcopy(ref)
    sch = slapo.create_schedule(model)
    sch["0"].annotate("weight", "replicated_param", True)  # by hand: no hook
    mark_replicated(sch["1"])  # hooks on LayerNorm weight and bias
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(rank))  # per-rank input
    for m in (ref, model):
        m(x).sum().backward()
    assert reduce_replicated_grads(model) == 1  # only the hand-tagged weight
    assert reduce_replicated_grads(model, None) == 1  # (it is counted every call)
    for name in ("0.weight", "1.weight", "1.bias"):
        want = ref.get_parameter(name).grad.clone()
        dist.all_reduce(want)
        if name == "0.weight":
            want = want * 2  # reduced by both calls above: the caller's choice
        torch.testing.assert_close(model.get_parameter(name).grad, want,
                                   msg=lambda m, n=name: f"{n}: {m}")
    return sorted(sch["1"].metadata["all_reduce_grads"])


def fsdp_keeps_hooks():
    """The fsdp target re-registers every tagged parameter's hook (its paths listed)."""
    model = tiny_model("llama", use_cache=False)
    sch = slapo.create_schedule(model)
    _llama(sch)
    built, _ = slapo.build(sch, target="fsdp")
    return len(built.slapo_tp_reduced_params)


def driver_sequence_parallel_llama():
    """The end2end driver's ``slapo`` mode with sequence_parallel=True, trained without any
    reduce call: the unscheduled ``eager`` mode's losses, replicated parameters equal on both
    ranks."""
    from end2end.driver.runtimes import ModelSchedule, make_runner

    batch = example_inputs("llama")
    out = {}
    for mode, schedule in (("eager", None),
                           ("slapo", ModelSchedule("llama", {"sequence_parallel": True}))):
        runner = make_runner(mode, tiny_model("llama", use_cache=False), schedule=schedule,
                             optimizer=_sgd, seed=0)
        out[mode] = [runner.train_step(batch) for _ in range(STEPS)]
        if mode == "slapo":
            replicated = _replicated(runner.model)
            assert all(grad_hook_installed(p) for p in replicated.values())
            out["compared"] = _same_on_all_ranks(replicated)
        runner.close()
    torch.testing.assert_close(out["slapo"], out["eager"], rtol=1e-4, atol=1e-5)
    return out["compared"]


def _all_checks():
    return {"build": sp_llama_through_build(False), "meta": sp_llama_through_build(True),
            "hand": hand_tagged_reduced_once(), "fsdp": fsdp_keeps_hooks(),
            "driver": driver_sequence_parallel_llama()}


def test_replicated_grads_reduced_by_the_schedule_on_two_ranks():
    results = run_distributed(_all_checks, 2, timeout=600)
    for r in results:
        assert r["build"] == r["meta"] == r["fsdp"] == 5  # 2 layers x 2 norms + final norm
        assert r["hand"] == ["bias", "weight"]
        assert r["driver"] >= 5


def test_one_rank_records_but_installs_nothing():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    sch = slapo.create_schedule(model)
    sch["1"].all_reduce_grads(["weight"])
    sch["1"].all_reduce_grads()  # again, with the bias: one entry per name
    assert sch["1"].metadata["all_reduce_grads"] == ["weight", "bias"]
    assert getattr(model[1].weight, GRAD_ALL_REDUCE_TAG, None) is None
    assert "all_reduce_grads(['weight'])" in sch.history.to_code()
    assert "all_reduce_grads" in slapo.list_primitives()


def test_unknown_parameter_is_a_config_error():
    sch = slapo.create_schedule(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)))
    with pytest.raises(ConfigError, match=r"\['wieght'\] are not parameters.*did you mean"):
        sch["1"].all_reduce_grads(["wieght"])
    with pytest.raises(ConfigError, match="not parameters"):
        sch.all_reduce_grads(["1.nope"])
