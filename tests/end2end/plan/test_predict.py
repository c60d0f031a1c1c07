"""Reduced-depth simulation: model names with a size changed, and the linear extrapolation from
2 and 4 layers against the full-depth simulation of a small model (the planner's accuracy
claim, docs/planning.md), with the memory lower bound below what the simulator predicts."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from end2end.models import get_model_spec
from end2end.plan.check import full_depth
from end2end.plan.cluster import parse_cluster
from end2end.plan.predict import predict, reduced_models, simulate_cached
from end2end.plan.rules import memory_lower_bound
from end2end.plan.search import PlanResult, SearchOptions
from end2end.plan.shapes import with_size
from end2end.plan.space import Candidate, Space

# 8 layers: simulated at 2 and 4 layers, extrapolated to 8, and simulated at 8
SMALL = "llama:layers=8,hidden=256,heads=8,kv_heads=4,ffn=704,vocab=1024,max_positions=256"


def test_a_size_changes_in_a_zoo_name_a_shape_and_a_config_json(tmp_path):
    assert with_size("llama-7b", "layers", 4, tmp_path) == "llama-7b:layers=4"
    assert with_size("llama-7b:layers=32,max_positions=4096", "layers", 4, tmp_path) == \
        "llama-7b:max_positions=4096,layers=4"
    assert get_model_spec(with_size("gpt2-xl", "layers", 2, tmp_path)).layers == 2
    assert with_size("tiny/wideresnet", "layers", 2, tmp_path) is None
    src = tmp_path / "config.json"
    src.write_text(json.dumps(dict(model_type="llama", num_hidden_layers=12, hidden_size=64,
                                   num_attention_heads=4, intermediate_size=128,
                                   vocab_size=256, max_position_embeddings=128)))
    copy = with_size(str(src), "layers", 2, tmp_path / "cache")
    assert copy != str(src) and get_model_spec(copy).layers == 2
    assert get_model_spec(str(src)).layers == 12  # the original is untouched


def _candidate(mode, tp, pp, ckpt):
    return Candidate(mode=mode, model=SMALL, n=2, seq=128, dec=0, batch=4, ckpt=ckpt,
                     dtype="bf16", tp=tp, pp=pp, micro=4 if pp == 1 else 2)


def test_the_extrapolation_from_2_and_4_layers_matches_the_full_depth_simulation(tmp_path):
    cluster = parse_cluster("h100-80gb:2x1")
    cand = _candidate("slapo", 2, 1, "0.5")
    assert [k for k, _ in reduced_models(cand, tmp_path)] == [8]  # cheaper whole (docs)
    models = reduced_models(cand, tmp_path, reduce_above=0)
    assert [k for k, _ in models] == [2, 4]
    result = PlanResult(SMALL, cluster, 128, 4, "bf16", Space([]), [], 0, 0, 0, 0, 0.0)
    with ThreadPoolExecutor(3) as pool:  # the three simulations at once
        reduced = [(k, pool.submit(simulate_cached, cand.run_spec(model=name), cluster,
                                   tmp_path, 600)) for k, name in models]
        whole = pool.submit(full_depth, cand, result, SearchOptions(cache=tmp_path))
        extrapolated = predict(cand, [(k, f.result()) for k, f in reduced], cluster)
        full = whole.result()
    assert extrapolated.depths == (2, 4) and extrapolated.status == "sim", extrapolated.error
    assert full.status == "sim" and full.depths == ()
    # the committed claim (docs/planning.md): within 5 % on a small model
    assert extrapolated.samples_per_s == pytest.approx(full.samples_per_s, rel=0.05)
    assert extrapolated.memory_gb == pytest.approx(full.memory_gb, rel=0.05)
    assert extrapolated.phases["recompute"] > 0 and extrapolated.phases["communication"] > 0
    # the rules' lower bound never exceeds what the simulator predicts
    bound = memory_lower_bound(get_model_spec(SMALL), cand.mode, "bf16", 2, 1, 1, 4, 128, 0.5)
    assert bound <= full.memory_gb * 1e9
    # the cache answers the same run again without simulating
    again = simulate_cached(cand.run_spec(), cluster, tmp_path, 600)
    assert again["_seconds"] == 0.0 and again["thrpt"] == pytest.approx(full.samples_per_s)


def test_the_phases_add_up_to_the_step_with_compute_slowed_beside_collectives():
    """A prediction's phases cover its whole step: the compute slowed beside overlapped
    collectives (the timing's ``contention``) is communication's cost, not lost."""
    from end2end.plan.predict import PHASES, _phases

    timing = dict(compute=1.0, compute_forward=0.4, comm_exposed=0.05, comm_hidden=0.3,
                  contention=0.048, total=1.098)
    values = dict(step_time=1.098, extra=dict(timing=[timing]))
    phases = _phases(values, "0.5")
    assert set(phases) == set(PHASES)
    assert sum(phases.values()) == pytest.approx(1.098)
    assert phases["communication"] == pytest.approx(0.098)
    assert phases["recompute"] == pytest.approx(0.2) and phases["bubble"] == 0
