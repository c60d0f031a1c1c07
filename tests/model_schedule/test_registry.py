import dataclasses

import pytest
import torch

import slapo
from slapo.model_schedule import (ScheduleConfig, apply_schedule, checkpoint_layer_ids,
                                  register_model_schedule)
from slapo.testing import MLP


@pytest.mark.parametrize("ratio,expected", [
    (0.0, []), (0.25, [2, 6]), (0.5, [1, 3, 5, 7]), (1.0, list(range(8)))])
def test_ckpt_ratio_picks_exact_evenly_spaced_layers(ratio, expected):
    assert checkpoint_layer_ids(8, ratio) == expected


@pytest.mark.parametrize("layers", [1, 3, 12, 24, 46])
def test_ckpt_ratio_counts(layers):
    for ratio in (0.1, 0.25, 0.34, 0.5, 0.67, 0.92, 1.0):
        ids = checkpoint_layer_ids(layers, ratio)
        assert len(ids) == int(layers * ratio + 0.5)
        assert ids == sorted(set(ids)) and all(0 <= i < layers for i in ids)


@register_model_schedule("toy_mlp_for_test", extra_knobs=("act",))
def _toy(sch, model_config, cfg, act="relu"):
    if act == "relu":
        sch["act"].replace(torch.nn.ReLU())
    if cfg.ckpt_ratio > 0:
        sch["fc1"].checkpoint()


def test_apply_schedule_and_knobs():
    sch = apply_schedule(MLP(), "toy_mlp_for_test", ckpt_ratio=1.0, act="relu")
    assert isinstance(sch.mod.act, torch.nn.ReLU)
    assert sch["fc1"].metadata["checkpoint"]
    sch = apply_schedule(MLP(), "toy_mlp_for_test", dtype="bf16")
    assert sch.mod.fc1.weight.dtype == torch.bfloat16


def test_unknown_knobs_and_values_are_errors():
    with pytest.raises(slapo.ConfigError, match="unknown knob.*'ckpt_raito'.*did you mean "
                       "'ckpt_ratio'"):
        apply_schedule(MLP(), "toy_mlp_for_test", ckpt_raito=0.5)
    with pytest.raises(slapo.ConfigError, match="no model schedule named 'nope'"):
        apply_schedule(MLP(), "nope")
    with pytest.raises(slapo.ConfigError, match="ckpt_ratio must be a number in"):
        ScheduleConfig(ckpt_ratio=1.5)
    with pytest.raises(slapo.ConfigError, match="dtype 'fp8'"):
        ScheduleConfig(dtype="fp8")
    with pytest.raises(slapo.ConfigError, match="attn_kernel 'xformers'"):
        ScheduleConfig(attn_kernel="xformers")
    cfg = ScheduleConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dtype = "fp16"
