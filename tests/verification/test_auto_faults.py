"""``slapo.verify`` earns its place on ``apply_schedule(model, "auto")`` (issue #27, item 4).

One fault per class, injected the way a wrong plan would produce it -- the plan dict edited
(set as ``base_model_tp_plan`` on the config instance, which both Slapo's auto schedule and HF
read) or a faulty primitive applied on the auto schedule -- must be caught and the module named.
Beside each, transformers' own DTensor path (``apply_tensor_parallelism`` with the same faulty
plan, 3 SGD steps) shows what an unverified run does: trains on silently, or refuses the plan
itself (said in the test's docstring). Everything runs in one 2-rank gloo spawn.

Verify runs in float32 here: Qwen3's RMSNorm computes in float32 whatever the model's dtype, so
float64 verification meets float32 noise (1e-7) everywhere, and the MoE experts' grouped_mm does
not take float64.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any, Callable, Dict, Optional

import pytest
import torch

from slapo.testing import run_distributed

Post = Optional[Callable[[Any], None]]
NOT_EXPERTS = ".mlp."  # plan keys of the MoE blocks (dropped: the block runs whole)


def _plan(model_type: str, **edits: Optional[str]) -> Dict[str, str]:
    """The family's own plan with ``edits`` (glob -> style; ``None`` drops the entry)."""
    from slapo.testing.models import tiny_plan_config

    plan = dict(type(tiny_plan_config(model_type)).base_model_tp_plan)
    for glob, style in edits.items():
        if style is None:
            plan.pop(glob)
        else:
            plan[glob] = style
    return plan


def _inputs(seed: int = 0) -> Dict[str, torch.Tensor]:
    ids = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids.clone()}


def _summary(report) -> Dict[str, Any]:
    return {"ok": report.ok, "rules": [p.path for p in report.problems],
            "error": report.error[0] if report.error else None,
            "grads": sorted(k for k, d in report.grads.items() if not d.ok),
            "first": report.first_divergence[0] if report.first_divergence else None,
            "text": str(report)}


def _slapo(model_type: str, plan: Dict[str, str], post: Post = None) -> Dict[str, Any]:
    """The auto schedule from ``plan`` (then ``post(sch)``), verified with rules and with the
    numerics alone; or the error that refused it while scheduling."""
    import slapo
    from slapo.model_schedule import apply_schedule
    from slapo.testing.models import tiny_plan_model

    ref = tiny_plan_model(model_type, base_model_tp_plan=plan)
    try:
        with warnings.catch_warnings():  # modules the plan leaves whole: reported, expected
            warnings.simplefilter("ignore", UserWarning)
            sch = apply_schedule(copy.deepcopy(ref), "auto", model_config=ref.config)
        if post is not None:
            post(sch)
    except slapo.SlapoError as e:
        return {"refused": f"{type(e).__name__}: {e}"}
    return {"rules": _summary(slapo.verify(sch, _inputs(), reference=ref,
                                           raise_on_mismatch=False)),
            "numeric": _summary(slapo.verify(sch, _inputs(), reference=ref, rules=False,
                                             raise_on_mismatch=False))}


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _hf(model_type: str, plan: Dict[str, str], watch: str = "", steps: int = 3
        ) -> Dict[str, Any]:
    """transformers' DTensor tensor parallelism from ``plan`` (as ``from_pretrained(...,
    tp_plan="auto")`` applies it), ``steps`` SGD steps beside the unsharded model: the losses of
    both, how far parameter ``watch`` drifted from the unsharded one, or the error raised."""
    from transformers.distributed import DistributedConfig
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    from slapo.testing.models import tiny_plan_model

    ref = tiny_plan_model(model_type, base_model_tp_plan=plan)
    model = copy.deepcopy(ref)
    try:
        config = DistributedConfig(tp_size=2, tp_plan="auto")
        resolved, _, _ = model._resolve_parallel_plans(config)
        _, _, meshes = type(model).prepare_distribute_model(config)
        apply_tensor_parallelism(model, meshes.get_mesh("tp"), resolved)
        losses = {}
        for name, m in (("hf", model), ("reference", ref)):
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            losses[name] = []
            for step in range(steps):
                opt.zero_grad()
                loss = m(**_inputs(step)).loss
                loss.backward()
                opt.step()
                losses[name].append(float(loss.detach()))
    except Exception as e:  # noqa: BLE001 - HF refusing the plan is a result
        return {"raised": f"{type(e).__name__}: {e}"}
    drift = 0.0
    if watch:
        drift = float((_full(model.get_parameter(watch).detach())
                       - ref.get_parameter(watch).detach()).abs().max())
    return {**losses, "drift": drift}


# ------------------------------------------------------------------ faults applied on the schedule
def _row_without_all_reduce(sch) -> None:
    """o_proj of layer 0 sharded row-wise (input axis) but its partial output never reduced."""
    from slapo.model_schedule import common as C
    from slapo.model_schedule.common import TPMode

    sch["model.layers.0.self_attn.o_proj"].shard("weight", axis=1)
    C.row_parallel(sch["model.layers.1.self_attn.o_proj"], TPMode(tp=True))


def _experts_again(expert_parallel: bool) -> Callable[[Any], None]:
    """Shard the already tensor-parallel experts of layer 0 a second time."""

    def post(sch) -> None:
        path = "model.layers.0.mlp.experts"
        if expert_parallel:  # what a TP plan plus an expert-parallel plan would ask for
            from slapo.model_schedule.common import TPMode
            from slapo.model_schedule.config import ScheduleConfig
            from slapo.model_schedule.moe import shard_experts

            shard_experts(sch, path, ScheduleConfig(), TPMode(tp=True), {}, expert_parallel=True)
        else:
            sch[path].shard("down_proj", axis=1)
    return post


def _router_on_token_shard(reduce_router_grad: bool) -> Callable[[Any], None]:
    """Every MoE block runs on this rank's half of the sequence (scatter before, gather after),
    with whole experts and a whole router; the experts' gradients are summed over the ranks.
    The router of layer 0 gets its gradient summed only with ``reduce_router_grad``."""

    def post(sch) -> None:
        from slapo.model_schedule.moe import replicate_router
        from slapo.sharding.sequence_parallel import mark_replicated

        for i in range(2):
            block = sch[f"model.layers.{i}.mlp"]
            block.sync("fwd_pre", "scatter", axis=1)
            block.sync("fwd_post", "all_gather", axis=1)
            mark_replicated(sch[f"model.layers.{i}.mlp.experts"])
            replicate_router(sch, f"model.layers.{i}.mlp.gate",
                             sharded_input=reduce_router_grad or i == 1)
    return post


def run_faults() -> Dict[str, Dict[str, Any]]:
    """Every case, on each rank: Slapo's outcome and HF's."""
    torch.set_num_threads(1)
    norms = {"layers.*.self_attn.q_norm": "replicate", "layers.*.self_attn.k_norm": "replicate"}
    dropped = dict.fromkeys(norms)
    packed = {"layers.*.mlp.gate_up_proj": "colwise", "layers.*.mlp.down_proj": "rowwise"}
    q_row = {"layers.*.self_attn.q_proj": "rowwise"}
    moe_whole = {k: v for k, v in _plan("mixtral").items() if NOT_EXPERTS not in k}
    q_norm = "model.layers.0.self_attn.q_norm.weight"
    return {
        "correct": {"slapo": _slapo("qwen3", _plan("qwen3"))},
        "packed_as_colwise": {"slapo": _slapo("phi3", _plan("phi3", **packed)),
                              "hf": _hf("phi3", _plan("phi3", **packed))},
        "q_proj_rowwise": {"slapo": _slapo("qwen3", _plan("qwen3", **q_row)),
                           "hf": _hf("qwen3", _plan("qwen3", **q_row))},
        "q_norm_replicate": {"slapo": _slapo("qwen3", _plan("qwen3", **norms)),
                             "hf": _hf("qwen3", _plan("qwen3", **norms), watch=q_norm)},
        "q_norm_dropped": {"slapo": _slapo("qwen3", _plan("qwen3", **dropped)),
                           "hf": _hf("qwen3", _plan("qwen3", **dropped), watch=q_norm)},
        "row_no_all_reduce": {"slapo": _slapo(
            "qwen3", _plan("qwen3", **{"layers.*.self_attn.o_proj": None}),
            _row_without_all_reduce)},
        "experts_twice_ep": {"slapo": _slapo("mixtral", _plan("mixtral"), _experts_again(True))},
        "experts_twice_shard": {"slapo": _slapo("mixtral", _plan("mixtral"),
                                                _experts_again(False))},
        "router_token_shard": {"slapo": _slapo("mixtral", moe_whole,
                                               _router_on_token_shard(False))},
        "router_token_shard_reduced": {"slapo": _slapo("mixtral", moe_whole,
                                                       _router_on_token_shard(True))},
        "router_hf_sequence_parallel": {"hf": _hf(
            "mixtral", {**moe_whole, "layers.*.mlp": "sequence_parallel"})},
    }


@pytest.fixture(scope="module")
def faults() -> Dict[str, Dict[str, Any]]:
    results = run_distributed(run_faults, 2, timeout=400)
    return results[0]


def _silent(hf: Dict[str, Any]) -> None:
    """HF's run raised nothing and every loss is finite."""
    assert "raised" not in hf, hf
    assert all(math.isfinite(x) for x in hf["hf"]), hf


def test_correct_plan_verifies(faults):
    """The control: the family's own plan passes both checks (so the cases below can fail)."""
    case = faults["correct"]["slapo"]
    assert case["rules"]["ok"] and case["numeric"]["ok"], case["rules"]["text"]


def test_wrong_axis_packed_projection_is_caught_hf_trains_wrong(faults):
    """(a) Wrong axis: Phi-3's packed ``gate_up_proj`` given plain ``colwise`` (and
    ``down_proj`` ``rowwise``): rank 0 gets every gate row, rank 1 every up row. The gathered
    projection output is still right, so the first module whose output differs is the
    activation that reads the wrong chunk, inside the same MLP. HF trains on with other
    numbers than the unsharded model from the first loss on."""
    for check in ("rules", "numeric"):
        got = faults["packed_as_colwise"]["slapo"][check]
        assert not got["ok"]
        assert got["first"] == "model.layers.0.mlp.activation_fn", got["text"]
        assert "model.layers.0.mlp.gate_up_proj.weight" in got["grads"]
    hf = faults["packed_as_colwise"]["hf"]
    _silent(hf)
    assert abs(hf["hf"][0] - hf["reference"][0]) > 1e-4, hf


def test_wrong_axis_rowwise_q_proj_is_named(faults):
    """(a) Wrong axis: q_proj ``colwise`` -> ``rowwise`` (the weight split on its input axis
    while its input is whole). Verify reports the scheduled model's error at q_proj. HF's path
    refuses this plan itself: its forward raises a shape error (no silent training)."""
    for check in ("rules", "numeric"):
        got = faults["q_proj_rowwise"]["slapo"][check]
        assert not got["ok"] and got["error"] == "model.layers.0.self_attn.q_proj", got["text"]
    assert "shape" in faults["q_proj_rowwise"]["hf"]["raised"]


def test_missing_grad_all_reduce_on_q_norm(faults):
    """(b) Missing all-reduce: Qwen3's ``q_norm``/``k_norm`` entries ``replicate`` instead of
    ``replicated_with_grad_allreduce``. The forward is right; each rank's norm gradient covers
    only its own heads. Verify names exactly those four weights. HF trains on silently, the
    norms drifting from the unsharded model's. Dropping the entries altogether: the auto
    schedule refuses the plan, naming q_norm; HF again trains on silently."""
    got = faults["q_norm_replicate"]["slapo"]["numeric"]
    norms = [f"model.layers.{i}.self_attn.{n}_norm.weight" for i in range(2) for n in "qk"]
    assert not got["ok"] and got["grads"] == sorted(norms), got["text"]
    assert not faults["q_norm_replicate"]["slapo"]["rules"]["ok"]
    hf = faults["q_norm_replicate"]["hf"]
    _silent(hf)
    assert hf["drift"] > 1e-5, hf
    refused = faults["q_norm_dropped"]["slapo"]["refused"]
    assert "model.layers.0.self_attn.q_norm" in refused and "sharded activations" in refused
    hf = faults["q_norm_dropped"]["hf"]
    _silent(hf)
    assert hf["drift"] > 1e-5, hf


def test_missing_row_all_reduce_is_refused_or_a_rule(faults):
    """(b) Missing all-reduce: o_proj left out of the plan (to be sharded row-wise by hand
    without ``sync("fwd_post", "all_reduce")``). The auto schedule now refuses the plan itself,
    before any change, naming o_proj (its weight would see the heads-sharded activation of its
    tensor-parallel region); where a schedule with the fault exists, the rule check names it
    before anything runs and the numerics name it as the first divergence. HF's ``rowwise``
    style always reduces (a DTensor ``Partial`` output is redistributed), so no HF plan
    expresses this fault."""
    o_proj = "model.layers.0.self_attn.o_proj"
    found = faults["row_no_all_reduce"]["slapo"]
    if "refused" in found:
        assert f"'{o_proj}'" in found["refused"] and "does not shard" in found["refused"], found
        return
    rules = found["rules"]
    assert not rules["ok"] and rules["rules"] == [o_proj], rules["text"]
    numeric = found["numeric"]
    assert not numeric["ok"] and numeric["first"] == o_proj, numeric["text"]


def test_expert_sharded_twice_is_refused_at_the_call(faults):
    """(c) An expert sharded twice: on Mixtral's auto schedule (tensor parallelism inside the
    experts), the experts sharded again by expert (a TP plan plus an expert-parallel plan) or one
    expert tensor sharded a second time. Both are refused at the call, naming the experts
    module, so a schedule with the fault never exists for verify to run. HF's path cannot
    express it: its EP rules replace the TP rules on the same modules
    (``_resolve_parallel_plans``), and a plan holds one style per name."""
    ep = faults["experts_twice_ep"]["slapo"]["refused"]
    assert "'model.layers.0.mlp.experts'" in ep and "already sharded" in ep, ep
    again = faults["experts_twice_shard"]["slapo"]["refused"]
    assert "'model.layers.0.mlp.experts'" in again and "already sharded" in again, again


def test_router_on_token_shard_without_grad_reduction(faults):
    """(d) A router without gradient reduction where it needs one: Mixtral's MoE blocks run on
    a token shard (half the sequence per rank), and layer 0's router is replicated without
    ``sharded_input=True``. Verify names exactly its weight; the same schedule with the
    reduction passes. HF's path refuses to feed a block a token shard: ``sequence_parallel`` on
    the MoE block fails in the router (a DTensor input against plain router weights)."""
    got = faults["router_token_shard"]["slapo"]
    for check in ("rules", "numeric"):
        assert not got[check]["ok"]
        assert got[check]["grads"] == ["model.layers.0.mlp.gate.weight"], got[check]["text"]
    fixed = faults["router_token_shard_reduced"]["slapo"]
    assert fixed["rules"]["ok"] and fixed["numeric"]["ok"], fixed["numeric"]["text"]
    assert "DTensor" in faults["router_hf_sequence_parallel"]["hf"]["raised"]
