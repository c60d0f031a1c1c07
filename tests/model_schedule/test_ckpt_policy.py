"""The ``ckpt_policy`` knob: the recipes checkpoint their ``ckpt_ratio`` layers selectively, and
train exactly like the unscheduled model on one rank and on a TP group of two gloo ranks."""

import warnings

import pytest
import torch

from slapo.errors import ConfigError
from slapo.model_schedule import apply_schedule
from slapo.runtime.checkpoint_policy import POLICIES
from slapo.testing import run_distributed, tiny_model
from tests.model_schedule.helpers import check_family, wideresnet

TP1_CASES = [("llama", 1.0, "save_every_other_matmul"), ("gpt2", 1.0, "save_matmuls"),
             ("bert", 1.0, "save_every_other_matmul"), ("albert", 0.5, "save_matmuls"),
             ("albert", 1.0, "save_every_other_matmul"), ("t5", 1.0, "save_matmuls")]
TP2_CASES = [("llama", dict(ckpt_ratio=1.0, ckpt_policy="save_every_other_matmul")),
             ("llama", dict(ckpt_ratio=1.0, ckpt_policy="save_matmuls", sequence_parallel=True)),
             ("gpt2", dict(ckpt_ratio=0.5, ckpt_policy="save_matmuls")),
             ("bert", dict(ckpt_ratio=1.0, ckpt_policy="save_every_other_matmul"))]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*backward hooks to be called.*")
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("family,ratio,policy", TP1_CASES)
def test_tp1_selective_matches_reference(family, ratio, policy):
    assert check_family(family, ckpt_ratio=ratio, ckpt_policy=policy) > 0


def test_recipe_checkpoints_the_ratio_layers_selectively():
    model = tiny_model("llama")
    sch = apply_schedule(model, "llama", ckpt_ratio=1.0, ckpt_policy="save_every_other_matmul")
    for i in range(2):
        meta = sch[f"model.layers.{i}"].metadata
        assert meta["checkpoint"] and meta["checkpoint_policy"] == POLICIES[
            "save_every_other_matmul"]
    sch = apply_schedule(tiny_model("llama"), "llama", ckpt_ratio=0.5, ckpt_policy="save_matmuls")
    policies = [sch[f"model.layers.{i}"].metadata.get("checkpoint_policy") for i in range(2)]
    assert policies.count(POLICIES["save_matmuls"]) == 1


def _tp2(cases):
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for family, knobs in cases:
        try:
            check_family(family, **knobs)
        except Exception as e:
            raise AssertionError(f"{family} {knobs}: {e}") from e
    return len(cases)


def test_tp2_selective_matches_reference():
    assert run_distributed(_tp2, 2, TP2_CASES, timeout=400) == [len(TP2_CASES)] * 2


def test_unknown_policy_and_wideresnet_are_refused():
    with pytest.raises(ConfigError, match=r"ckpt_policy 'op' is unknown.*Hint: use "
                                          r"'save_matmuls', 'save_every_other_matmul'"):
        apply_schedule(tiny_model("gpt2"), "gpt2", ckpt_ratio=1.0, ckpt_policy="op")
    with pytest.raises(ConfigError, match=r"not supported by the WideResNet schedule.*Hint: a "
                                          r"convolutional network has no matmuls"):
        apply_schedule(wideresnet(), "wideresnet", ckpt_ratio=1.0, ckpt_policy="save_matmuls")
