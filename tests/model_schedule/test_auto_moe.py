"""Mixture-of-experts sharding (``slapo.model_schedule.moe``) on 2 gloo ranks: Mixtral, Qwen3-MoE
and DeepSeek-V3, tensor parallelism inside the experts and expert parallelism, against the
unscheduled model (outputs, load-balancing loss, every gradient incl. the router's, losses over
3 SGD steps), plus the refusals."""

from __future__ import annotations

import copy

import pytest
import torch

from slapo.testing import run_distributed

FAMILIES = ("mixtral", "qwen3_moe", "deepseek_v3")
PLAN = {"gate_up_proj": "packed_colwise", "down_proj": "rowwise"}


def tiny_moe_config(family: str, **overrides):
    """A tiny MoE config: hidden 32, 2 layers, 4 experts (top-2, intermediate 16), router logits
    returned and a load-balancing loss weight large enough to matter (Mixtral, Qwen3-MoE)."""
    from transformers import DeepseekV3Config, MixtralConfig, Qwen3MoeConfig

    common = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=0,
                  output_router_logits=True)
    if family == "mixtral":
        kw = dict(intermediate_size=16, num_key_value_heads=2, num_local_experts=4,
                  num_experts_per_tok=2, router_aux_loss_coef=0.1, router_jitter_noise=0.0)
        return MixtralConfig(**{**common, **kw, **overrides})
    if family == "qwen3_moe":
        kw = dict(intermediate_size=32, moe_intermediate_size=16, num_key_value_heads=2,
                  head_dim=8, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                  router_aux_loss_coef=0.1)
        return Qwen3MoeConfig(**{**common, **kw, **overrides})
    kw = dict(intermediate_size=32, moe_intermediate_size=16, num_key_value_heads=4,
              n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
              topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16,
              qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, head_dim=8)
    return DeepseekV3Config(**{**common, **kw, **overrides})


def tiny_moe_model(family: str, seed: int = 0, experts_impl: str = "", **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_moe_config(family, **overrides))
    if experts_impl:
        model.config._experts_implementation = experts_impl
    return model.train()


def moe_layers(model):
    """Paths of the MoE blocks (those with an ``experts`` child)."""
    return [p.rsplit(".", 1)[0] for p, _ in model.named_modules() if p.endswith(".mlp.experts")]


def schedule_moe(model, *, expert_parallel: bool, plan=None):
    import slapo
    from slapo.model_schedule.common import TPMode
    from slapo.model_schedule.config import ScheduleConfig
    from slapo.model_schedule.moe import replicate_router, shard_experts

    sch = slapo.create_schedule(model)
    mode = TPMode(tp=sch.world_size > 1)
    for block in moe_layers(model):
        shard_experts(sch, f"{block}.experts", ScheduleConfig(), mode, PLAN if plan is None
                      else plan, expert_parallel=expert_parallel)
        replicate_router(sch, f"{block}.gate")
    return sch


def _inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 64, (3, 5), generator=g)  # 15 tokens: not a multiple of 2 ranks
    return {"input_ids": ids, "labels": ids}


def _full_grads(model, like):
    from slapo.verification.tools import to_full

    return {n: to_full(p.grad, None, like[n], param=p) for n, p in model.named_parameters()
            if p.grad is not None}


def _expert_numel(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)


def _check_one_step(family: str, expert_parallel: bool, experts_impl: str = "") -> None:
    ref = tiny_moe_model(family, experts_impl=experts_impl)
    model = copy.deepcopy(ref)
    schedule_moe(model, expert_parallel=expert_parallel)
    assert _expert_numel(model) * 2 == _expert_numel(ref), "each rank holds half the experts"
    outs = []
    for m in (ref, model):
        out = m(**_inputs())
        out.loss.backward()
        outs.append(out)
    ctx = f"{family} expert_parallel={expert_parallel} {experts_impl}"
    torch.testing.assert_close(outs[1].logits, outs[0].logits, msg=lambda m: f"{ctx}: {m}")
    torch.testing.assert_close(outs[1].loss, outs[0].loss)
    if family != "deepseek_v3":  # DeepSeek-V3 balances without an auxiliary loss
        assert outs[0].aux_loss is not None and outs[0].aux_loss > 0
        torch.testing.assert_close(outs[1].aux_loss, outs[0].aux_loss)
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    grads = _full_grads(model, ref_grads)
    assert grads.keys() == ref_grads.keys()
    assert any(".mlp.gate." in n for n in grads), "the router has a gradient"
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, n=name: f"{ctx}: gradient of '{n}': {m}")


def _losses(model, steps: int = 3):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = model(**_inputs(seed=10 + step)).loss
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def _check_training(family: str, expert_parallel: bool) -> None:
    ref = tiny_moe_model(family)
    model = copy.deepcopy(ref)
    schedule_moe(model, expert_parallel=expert_parallel)
    expected, got = _losses(ref), _losses(model)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def _equivalence_worker(family: str) -> None:
    for expert_parallel in (False, True):
        _check_one_step(family, expert_parallel)
        _check_training(family, expert_parallel)
    if family == "mixtral":  # the eager loop as well as the default grouped_mm; and verify
        for expert_parallel in (False, True):
            _check_one_step(family, expert_parallel, experts_impl="eager")
            _check_verify(family, expert_parallel)


def _check_verify(family: str, expert_parallel: bool) -> None:
    """``slapo.verify`` maps the sharded experts (same names, ShardSpecs) to the original's."""
    import slapo

    ref = tiny_moe_model(family)
    sch = schedule_moe(copy.deepcopy(ref), expert_parallel=expert_parallel)
    report = slapo.verify(sch, _inputs(), reference=ref)
    assert report.ok and len(report.grads) == len(list(ref.parameters())), report.failures()


@pytest.mark.parametrize("family", FAMILIES)
def test_moe_sharding_matches_unscheduled_on_two_ranks(family):
    run_distributed(_equivalence_worker, 2, family, timeout=240)


def _one_rank_worker() -> None:
    ref = tiny_moe_model("mixtral")
    model = copy.deepcopy(ref)
    for expert_parallel in (False, True):
        schedule_moe(model, expert_parallel=expert_parallel)  # a world of one: nothing to shard
    assert _expert_numel(model) == _expert_numel(ref)
    torch.testing.assert_close(_losses(model), _losses(ref))


def test_moe_sharding_on_one_rank_changes_nothing():
    run_distributed(_one_rank_worker, 1, timeout=120)


def _skewed_routing_worker() -> None:
    """Every token routed to rank 0's experts: rank 1 receives no rows, rank 0 all of them."""
    import slapo
    from slapo.model_schedule.common import TPMode
    from slapo.model_schedule.config import ScheduleConfig
    from slapo.model_schedule.moe import shard_experts

    model = tiny_moe_model("mixtral")
    ref = copy.deepcopy(model.model.layers[0].mlp.experts)
    sch = slapo.create_schedule(model)
    shard_experts(sch, "model.layers.0.mlp.experts", ScheduleConfig(), TPMode(tp=True), PLAN,
                  expert_parallel=True)
    experts = sch["model.layers.0.mlp.experts"].mod
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(7, 32, generator=g)
    index = torch.tensor([[0, 1], [1, 0], [0, 1], [1, 0], [0, 1], [0, 1], [1, 0]])
    weights = torch.rand(7, 2, generator=g)
    results = []
    for mod in (ref, experts):
        h, w = hidden.clone().requires_grad_(), weights.clone().requires_grad_()
        out = mod(h, index, w)
        (out * torch.arange(32.0)).sum().backward()
        results.append((out, h.grad, w.grad))
    for got, expected in zip(results[1], results[0]):
        torch.testing.assert_close(got, expected)


def _refusals_worker() -> None:
    import slapo
    from slapo.errors import ConfigError, ShardError
    from slapo.model_schedule.common import TPMode
    from slapo.model_schedule.config import ScheduleConfig
    from slapo.model_schedule.moe import replicate_router, shard_experts

    path, cfg, tp = "model.layers.0.mlp.experts", ScheduleConfig(), TPMode(tp=True)

    def fresh(**overrides):
        return slapo.create_schedule(tiny_moe_model("mixtral", **overrides))

    with pytest.raises(ConfigError, match="3 experts cannot be split over 2 ranks"):
        shard_experts(fresh(num_local_experts=3), path, cfg, tp, PLAN, expert_parallel=True)
    with pytest.raises(ConfigError, match="intermediate size 15 is not divisible"):
        shard_experts(fresh(intermediate_size=15), path, cfg, tp, PLAN, expert_parallel=False)
    with pytest.raises(ConfigError, match="splits axis 2, but its intermediate axis is 1"):
        shard_experts(fresh(), path, cfg, tp, {"gate_up_proj": "rowwise", "down_proj": "rowwise"},
                      expert_parallel=False)
    with pytest.raises(ConfigError, match="names no expert tensor"):
        shard_experts(fresh(), path, cfg, tp, {**PLAN, "gate_proj": "colwise"},
                      expert_parallel=False)
    with pytest.raises(ConfigError, match="but not down_proj"):
        shard_experts(fresh(), path, cfg, tp, {"gate_up_proj": "packed_colwise"},
                      expert_parallel=False)
    with pytest.raises(ConfigError, match="style 'local_colwise'"):
        shard_experts(fresh(), path, cfg, tp, {**PLAN, "down_proj": "local_colwise"},
                      expert_parallel=False)
    with pytest.raises(ConfigError, match="sequence parallelism"):
        shard_experts(fresh(), path, cfg, TPMode(tp=True, sp=True), PLAN, expert_parallel=False)
    sch = fresh()
    shard_experts(sch, path, cfg, tp, PLAN, expert_parallel=False)
    with pytest.raises(ConfigError, match="already sharded"):
        shard_experts(sch, path, cfg, tp, PLAN, expert_parallel=True)
    with pytest.raises(ShardError, match="already sharded"):
        shard_experts(sch, path, cfg, tp, PLAN, expert_parallel=False)
    sch["model.layers.0.mlp.gate"].shard("weight", axis=0)
    with pytest.raises(ConfigError, match="the router's weight are sharded"):
        replicate_router(sch, "model.layers.0.mlp.gate")
    with pytest.raises(ConfigError, match="no parameters"):
        replicate_router(sch, "model.layers.0.mlp.experts.act_fn")


def _sharded_router_worker() -> None:
    """A router fed a different token shard on each rank: its gradient is summed over the
    ranks in backward (the hooks of ``replicate_router(..., sharded_input=True)``), once:
    reduce_replicated_grads finds nothing left."""
    import slapo

    model = tiny_moe_model("mixtral")
    gate = model.model.layers[0].mlp.gate
    ref = copy.deepcopy(gate)
    sch = slapo.create_schedule(model)
    from slapo.model_schedule.moe import replicate_router

    replicate_router(sch, "model.layers.0.mlp.gate", sharded_input=True)
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(5))
    ref(x)[1].pow(2).sum().backward()
    gate(x.chunk(2)[sch.rank])[1].pow(2).sum().backward()
    assert slapo.reduce_replicated_grads(model) == 0
    torch.testing.assert_close(gate.weight.grad, ref.weight.grad)


def _transposed_experts():
    """HF's experts machinery (``use_experts_implementation(is_transposed=True)``, the
    ``batched_mm`` forward) on a tiny module with Aria/Llama4-style ``[E, H, 2I]`` /
    ``[E, I, H]`` tensors."""
    from torch import nn
    from transformers import PretrainedConfig
    from transformers.activations import ACT2FN
    from transformers.integrations.moe import use_experts_implementation

    @use_experts_implementation(is_transposed=True)
    class TransposedExperts(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.num_experts = 4
            self.gate_up_proj = nn.Parameter(torch.randn(4, 8, 12))
            self.down_proj = nn.Parameter(torch.randn(4, 6, 8))
            self.act_fn = ACT2FN["silu"]

        def forward(self, hidden_states, top_k_index, top_k_weights):
            raise NotImplementedError("runs through the batched_mm implementation")

    config = PretrainedConfig()
    config._experts_implementation = "batched_mm"
    torch.manual_seed(4)
    return nn.ModuleDict({"experts": TransposedExperts(config)})


def _transposed_layout_worker() -> None:
    """Transposed experts: the row-wise styles split their intermediate axis (an empty plan
    splits the same axes), and expert parallelism works on them too."""
    import slapo
    from slapo.model_schedule.common import TPMode
    from slapo.model_schedule.config import ScheduleConfig
    from slapo.model_schedule.moe import shard_experts
    from slapo.verification.tools import to_full

    ref = _transposed_experts()
    g = torch.Generator().manual_seed(6)
    hidden, weights = torch.randn(9, 8, generator=g), torch.rand(9, 2, generator=g)
    index = torch.randint(0, 4, (9, 2), generator=g)
    plans = [({"gate_up_proj": "packed_rowwise", "down_proj": "colwise"}, False), ({}, False),
             ({}, True)]
    for plan, expert_parallel in [(None, None), *plans]:
        model = copy.deepcopy(ref)
        if plan is not None:
            shard_experts(slapo.create_schedule(model), "experts", ScheduleConfig(),
                          TPMode(tp=True), plan, expert_parallel=expert_parallel)
        h, w = hidden.clone().requires_grad_(), weights.clone().requires_grad_()
        out = model["experts"](h, index, w)
        (out * torch.arange(8.0)).sum().backward()
        got = [out, h.grad, w.grad] + [to_full(p.grad, None, q, param=p) for p, q in
                                        zip(model.parameters(), ref.parameters())]
        if plan is None:
            expected = got
            continue
        assert model["experts"].gate_up_proj.numel() * 2 == ref["experts"].gate_up_proj.numel()
        ctx = f"{plan} expert_parallel={expert_parallel}"
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, msg=lambda m, ctx=ctx: f"{ctx}: {m}")


def _edge_cases_worker() -> None:
    _transposed_layout_worker()
    _skewed_routing_worker()
    _sharded_router_worker()
    _refusals_worker()


def test_moe_skewed_routing_sharded_router_and_refusals():
    """One spawn: transposed experts (both forms), expert parallelism with every token on one
    rank's experts, a router fed token shards (gradient summed), and every refusal of the
    module docstring."""
    run_distributed(_edge_cases_worker, 2, timeout=180)


def _meta_model(config):
    import slapo
    from transformers import AutoModelForCausalLM

    with slapo.init_empty_weights():
        return AutoModelForCausalLM.from_config(config)


def _delayed_init_checkpoint_worker(ckpt_dir: str) -> None:
    """A meta model scheduled either way materialises exactly the slices of the unscheduled
    model's values, and its sharded checkpoint loads into an unsharded model."""
    import slapo
    from transformers import AutoModelForCausalLM

    from slapo.verification.tools import to_full

    config = tiny_moe_config("mixtral")
    full, _ = slapo.build(slapo.create_schedule(_meta_model(config)), init_weights=True,
                          init_seed=0)
    expected = dict(full.named_parameters())
    for expert_parallel in (False, True):
        sch = schedule_moe(_meta_model(config), expert_parallel=expert_parallel)
        model, _ = slapo.build(sch, init_weights=True, init_seed=0)
        assert _expert_numel(model) * 2 == _expert_numel(full)
        for name, p in model.named_parameters():
            torch.testing.assert_close(to_full(p.detach(), None, expected[name], param=p),
                                       expected[name].detach(), msg=lambda m, n=name: n)
        slapo.save_training_state(f"{ckpt_dir}/ep{int(expert_parallel)}", model)
        plain, _ = slapo.build(slapo.create_schedule(AutoModelForCausalLM.from_config(config)))
        slapo.load_training_state(f"{ckpt_dir}/ep{int(expert_parallel)}", plain)
        for name, p in plain.named_parameters():
            torch.testing.assert_close(p, expected[name], msg=lambda m, n=name: n)


def test_moe_delayed_init_and_checkpoint(tmp_path):
    run_distributed(_delayed_init_checkpoint_worker, 2, str(tmp_path), timeout=180)


def _auto_worker() -> None:
    """``apply_schedule(model, "auto", expert_parallel=...)`` reaches these functions through
    the plan's ``moe_tp_experts`` entries: same losses over 3 steps, half the expert weights."""
    import warnings

    import slapo
    from slapo.model_schedule import apply_schedule

    for expert_parallel in (False, True):
        ref = tiny_moe_model("mixtral")
        with warnings.catch_warnings():  # the plan leaves the norms whole: reported, expected
            warnings.simplefilter("ignore", UserWarning)
            sch = apply_schedule(copy.deepcopy(ref), "auto", model_config=ref.config,
                                 expert_parallel=expert_parallel)
        model, _ = slapo.build(sch)
        assert _expert_numel(model) * 2 == _expert_numel(ref)
        torch.testing.assert_close(_losses(model), _losses(ref), rtol=1e-5, atol=1e-5)


def test_auto_schedule_shards_the_experts():
    run_distributed(_auto_worker, 2, timeout=180)
