"""The plan framework behind ``apply_schedule(model, "auto")``: reading and resolving HF plans,
clear errors for what cannot be honoured, the report of unsharded modules, one gradient
all-reduce per shared input, and a history that replays (numerics of every family:
``test_auto_families.py``)."""

import copy
import warnings

import pytest
import torch

from slapo.errors import ConfigError
from slapo.model_schedule import apply_schedule
from slapo.model_schedule.tp_plan import read_plan, resolve_plan
from slapo.testing import run_distributed
from slapo.testing.models import tiny_plan_config, tiny_plan_model
from tests.model_schedule.helpers import compare_training
from tests.model_schedule.test_auto_families import plan_inputs


def test_read_and_resolve_plan():
    model = tiny_plan_model("qwen3")
    plan = read_plan(model)
    assert plan["model.layers.*.self_attn.q_norm"] == "replicated_with_grad_allreduce"
    assert plan["lm_head"] == "colwise_gather_output"
    entries = resolve_plan(model, plan)
    targets = {e.target: e.style for e in entries}
    assert targets["model.layers.1.mlp.down_proj"] == "rowwise"
    assert targets["model.layers.0.self_attn.k_norm"] == "replicated_with_grad_allreduce"
    assert len([t for t in targets if t.endswith("q_proj")]) == 2  # one per layer


def test_tiny_plan_config_shrinks_generically():
    for family in ("qwen3", "mixtral", "deepseek_v3", "codegen"):
        config = tiny_plan_config(family)
        assert config.hidden_size == 64 and config.vocab_size == 128, family
        assert config.num_hidden_layers == 2, family
    assert tiny_plan_config("mixtral").num_local_experts == 4
    assert tiny_plan_config("qwen3", hidden_size=32).hidden_size == 32
    with pytest.raises(ValueError, match="unknown model_type"):
        tiny_plan_config("not_a_family")


def test_model_without_plan_is_refused():
    from slapo.testing import tiny_model

    with pytest.raises(ConfigError, match="declares no tensor-parallel plan"):
        apply_schedule(tiny_model("bert"), "auto")


def test_unknown_style_is_an_error_naming_the_entry():
    model = tiny_plan_model("llama")
    model.config.base_model_tp_plan = {"layers.*.mlp.up_proj": "colwise_sideways"}
    with pytest.raises(ConfigError, match=r"'model\.layers\.\*\.mlp\.up_proj: colwise_sideways'"
                       r".*unknown style"):
        apply_schedule(model, "auto")


def test_refused_style_names_entry_and_why():
    with pytest.raises(ConfigError, match=r"kv_a_proj_with_mqa: mla_kv_a_proj'.*latent"):
        apply_schedule(tiny_plan_model("deepseek_v2"), "auto")


def _tp2_errors():
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    seen = []
    # GQA: 3 kv heads cannot be split over 2 ranks (HF attention sharded by the plan, and the
    # op library's attention for LLaMA)
    for family in ("qwen3", "llama"):
        model = tiny_plan_model(family, num_attention_heads=6, num_key_value_heads=3,
                                hidden_size=96)
        with pytest.raises(ConfigError, match=r"3 (key/value )?heads.*cannot be split over 2"):
            apply_schedule(model, "auto")
        seen.append(f"kv:{family}")
    # an entry whose module does not fit its style
    model = tiny_plan_model("qwen3")
    model.config.base_model_tp_plan = {"layers.*.input_layernorm": "colwise"}
    with pytest.raises(ConfigError, match=r"input_layernorm: colwise'.*Linear modules"):
        apply_schedule(model, "auto")
    seen.append("unfit")
    # sequence parallelism where the plan gathers activations (phi3)
    with pytest.raises(ConfigError, match="sequence_parallel is not supported.*gathers"):
        apply_schedule(tiny_plan_model("phi3"), "auto", sequence_parallel=True)
    seen.append("sp")
    return seen


def test_tp2_clear_errors():
    results = run_distributed(_tp2_errors, 2, timeout=300)
    assert results[0] == results[1] == ["kv:qwen3", "kv:llama", "unfit", "sp"]


def _syncs(sch, path):
    return [(r.mode, r.op) for r in sch[path].metadata.get("sync", [])]


def _tp2_report_grouping_replay():
    torch.set_num_threads(1)
    ref = tiny_plan_model("qwen3")
    model = copy.deepcopy(ref)
    with pytest.warns(UserWarning, match=r"leaves the parameters.*model\.layers\.\*\."
                      r"input_layernorm"):
        sch = apply_schedule(model, "auto", shard_embedding=False)
    warnings.filterwarnings("ignore")
    unsharded = sch.metadata["tp_plan_unsharded"]
    assert "model.embed_tokens" in unsharded and "lm_head" in unsharded
    assert not any("q_norm" in u for u in unsharded)  # replicated on purpose, grads reduced
    assert "tp_plan_unsharded" in str(sch)  # explain shows it
    # one input-gradient all-reduce per shared input, none on the projections
    layer = "model.layers.0"
    assert _syncs(sch, f"{layer}.self_attn") == [("bwd_post", "all_reduce")]
    assert _syncs(sch, f"{layer}.mlp") == [("bwd_post", "all_reduce")]
    for proj in ("self_attn.q_proj", "self_attn.k_proj", "mlp.gate_proj", "mlp.up_proj"):
        assert _syncs(sch, f"{layer}.{proj}") == [], proj
    assert sch[f"{layer}.self_attn.q_norm"].metadata["all_reduce_grads"] == ["weight"]
    # the history prints and replays on a fresh model into one that trains the same
    code = str(sch.history)
    assert "all_reduce_grads()" in code and "shard(" in code
    replayed = copy.deepcopy(ref)
    sch.history.replay(replayed)
    compare_training(ref, replayed, plan_inputs())
    return sorted(unsharded)


def test_tp2_unsharded_report_grad_grouping_and_replay():
    results = run_distributed(_tp2_report_grouping_replay, 2, timeout=300)
    assert results[0] == results[1]
