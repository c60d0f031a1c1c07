"""The auto schedule is *plan, check, apply* (issue #36): a refused model is exactly the model
passed in (parameters, buffers, module types, forwards, hooks, loss function, config); the plan
is read as transformers resolves it (real module paths, sub-configs' plans) and an entry that
addresses a path the model lacks is refused; the loss follows the head (masked LM, seq2seq with
a tied decoder embedding, sequence classification) and matches HF's on 1 and 2 ranks."""

import copy
import warnings
from typing import Any, Dict

import pytest
import torch

from slapo.errors import ConfigError
from slapo.model_schedule import apply_schedule
from slapo.model_schedule.tp_plan import read_plan
from slapo.testing import run_distributed
from slapo.testing.models import tiny_plan_model
from tests.model_schedule.test_auto_families import check_families, plan_inputs


def snapshot(model: torch.nn.Module) -> Dict[str, Any]:
    """Everything a schedule could change, by value and by identity."""
    mods = list(model.named_modules())
    return {
        "params": [(n, id(p), p.detach().clone(), p.requires_grad)
                   for n, p in model.named_parameters(remove_duplicate=False)],
        "buffers": [(n, id(b), b.clone()) for n, b in model.named_buffers()],
        "types": [(n, type(m)) for n, m in mods],
        "attrs": [(n, sorted(k for k in vars(m) if not k.startswith("_"))) for n, m in mods],
        "own": [(n, m.__dict__.get("forward"), m.__dict__.get("_loss_function")) for n, m in mods],
        "hooks": [(n, len(m._forward_hooks), len(m._forward_pre_hooks),
                   len(m._backward_hooks), len(m._backward_pre_hooks)) for n, m in mods],
        "config": model.config.to_dict(),
    }


def assert_same(before: Dict[str, Any], after: Dict[str, Any]) -> None:
    for key in ("types", "attrs", "own", "hooks", "config"):
        assert before[key] == after[key], key
    for old, new in zip(before["params"], after["params"], strict=True):
        assert old[:2] == new[:2] and old[3] == new[3], old[0]
        assert torch.equal(old[2], new[2]), old[0]
    for old, new in zip(before["buffers"], after["buffers"], strict=True):
        assert old[:2] == new[:2] and torch.equal(old[2], new[2]), old[0]


def _renamed_llama_plan() -> Dict[str, str]:
    """LLaMA's plan with its attention and MLP renamed (``attn``, ``feed_forward``): every layer
    entry matches nothing under the existing ``layers`` list (past ``check_plan_paths``)."""
    from transformers import LlamaConfig

    return {g.replace("self_attn.", "attn.").replace("mlp.", "feed_forward."): s
            for g, s in LlamaConfig.base_model_tp_plan.items()}


# (family, overrides of the tiny config, knobs, what the error says)
REFUSALS = (
    ("llama", {"num_attention_heads": 6, "num_key_value_heads": 3, "hidden_size": 96}, {},
     r"3 heads.*cannot be split over 2"),
    ("cohere", {"num_attention_heads": 6, "num_key_value_heads": 3, "hidden_size": 96}, {},
     r"3 heads.*cannot be split over 2"),
    ("mixtral", {"num_local_experts": 3}, {"expert_parallel": True},
     r"3 experts cannot be split over 2 ranks"),
    ("gemma2", {}, {"sequence_parallel": True}, r"sequence_parallel is not supported.*norms"),
    ("qwen3", {}, {"sequence_parallel": True, "pipeline_cuts": [5]},
     r"pipeline_cuts needs example_inputs"),
    # a per-head parameter one level below the attention, whose output projection is one
    # level down too (output_projection.o_proj): still inside the TP region
    ("neomme:masked", {}, {}, r"\['alpha'\] inside the tensor-parallel region "
     r"'model\.layers\.0\.self_attn'"),
    # the plan's layer entries name modules the layers do not have: only the embedding and
    # head would be sharded; refused, naming the entries and the whole modules of their name
    ("llama", {"base_model_tp_plan": _renamed_llama_plan()}, {},
     r"shard only 0% of the parameters of 'model\.layers'.*'model\.layers\.\*\.attn\.q_proj: "
     r"colwise' \(whole: model\.layers\.\*\.self_attn\.q_proj\)"),
)


def _refusals_leave_model_unchanged():
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    done = []
    for family, overrides, knobs, match in REFUSALS:
        name, _, head = family.partition(":")
        model = tiny_plan_model(name, head=head or "causal", **overrides)
        inputs = plan_inputs()
        torch.manual_seed(0)
        loss = model(**inputs).loss.detach()
        before = snapshot(model)
        with pytest.raises(ConfigError, match=match) as err:
            apply_schedule(model, "auto", **knobs)
        assert "\n" not in str(err.value), str(err.value)
        assert_same(before, snapshot(model))
        torch.manual_seed(0)
        torch.testing.assert_close(model(**inputs).loss.detach(), loss, rtol=0, atol=0)
        done.append(family)
    return done


def test_refused_model_is_unchanged_tp2():
    results = run_distributed(_refusals_leave_model_unchanged, 2, timeout=300)
    assert results[0] == results[1] == [r[0] for r in REFUSALS]


def test_plan_follows_real_paths_and_sub_configs():
    # Llama 4: base_model_prefix says 'language_model', the child is 'model'
    plan = read_plan(tiny_plan_model("llama4_text"))
    assert "model.layers.*.self_attn.q_proj" in plan
    assert not any(g.startswith("layers.") for g in plan), sorted(plan)[:3]
    # Qwen2-VL run text-only: the text sub-config's plan, under the language model
    vlm = tiny_plan_model("qwen2_vl", head="image_text")
    plan = read_plan(vlm)
    assert plan["model.language_model.layers.*.mlp.down_proj"] == "rowwise"
    assert plan["lm_head"] == "colwise_gather_output"


def test_plan_entry_matching_no_path_is_refused_unchanged():
    model = tiny_plan_model("llama")
    model.config.base_model_tp_plan = {"decoder.layers.*.mlp.up_proj": "colwise"}
    before = snapshot(model)
    with pytest.raises(ConfigError, match=r"'model\.decoder\.layers\.\*\.mlp\.up_proj: colwise' "
                       r"matches nothing: 'model\.decoder\.layers' is not a module"):
        apply_schedule(model, "auto")
    assert_same(before, snapshot(model))


# masked LM (unshifted loss), seq2seq whose decoder embedding is tied to the vocab-sharded head,
# sequence classification (HF's loss on the score head; T5Gemma's: its decoder embedding is
# sharded as the plan says), a VLM run text-only
HEADS = ("eurobert:masked", "t5gemma:seq2seq", "gemma2:seqcls", "gemma3:image_text",
         "t5gemma:seqcls")


def test_auto_heads_one_rank():
    results = check_families(HEADS[:3])
    assert all(r == "ok" for r in results.values()), results


def test_auto_heads_tp2():
    results = run_distributed(check_families, 2, HEADS, timeout=600)
    for rank, result in enumerate(results):
        assert all(r == "ok" for r in result.values()), (rank, result)


def _loss_kinds():
    warnings.filterwarnings("ignore")
    kinds = {}
    for family in ("llama", "eurobert:masked", "t5gemma:seq2seq", "gemma2:seqcls"):
        name, _, head = family.partition(":")
        model = tiny_plan_model(name, head=head or "causal")
        kinds[family] = apply_schedule(copy.deepcopy(model), "auto").metadata["auto_loss"]
    return kinds


def test_loss_follows_the_head_tp2():
    kinds = run_distributed(_loss_kinds, 2, timeout=300)[0]
    assert kinds == {"llama": "causal", "eurobert:masked": "masked",
                     "t5gemma:seq2seq": "masked", "gemma2:seqcls": "model"}


def _tied_head_stays_whole_with_its_embedding():
    warnings.filterwarnings("ignore")
    from tests.model_schedule.helpers import compare_training

    ref = tiny_plan_model("llama", tie_word_embeddings=True)
    plan = dict(type(ref.config).base_model_tp_plan)
    ref.config.base_model_tp_plan = {**plan, "embed_tokens": "replicate"}
    model = copy.deepcopy(ref)
    sch = apply_schedule(model, "auto")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.shape == ref.lm_head.weight.shape  # whole, with its embedding
    compare_training(ref, model, plan_inputs())
    return sch.metadata["auto_loss"]


def test_head_tied_to_a_whole_embedding_stays_whole_tp2():
    """The plan keeps the embedding whole ('replicate') and the head is tied to it: the head's
    own plan entry ('lm_head: colwise_gather_output') would shard the embedding's weight too
    and leave its lookups partial, so the head stays whole with it."""
    assert run_distributed(_tied_head_stays_whole_with_its_embedding, 2,
                           timeout=300) == ["model", "model"]


def test_coverage_tells_renamed_modules_from_unused_layer_kinds():
    """``tp_plan.check_coverage`` (run by auto under TP, before any change): the renamed plan is
    refused; unmatched entries of a layer kind the config does not use are not (Flint's dense
    config: expert entries unmatched, attention without entries, 50 % whole; MuseSpark's dense
    ``mlp.*`` entries beside a MoE ``mlp`` whose attention has a ``gate_proj`` of its own)."""
    from slapo.model_schedule.tp_plan import check_coverage, layer_coverage, resolve_plan

    warnings.filterwarnings("ignore")
    model = tiny_plan_model("llama", base_model_tp_plan=_renamed_llama_plan())
    plan = read_plan(model)
    [cov] = layer_coverage(model, plan, resolve_plan(model, plan))
    assert cov.fraction == 0 and len(cov.unmatched) == len(cov.misaddressed) == 7
    with pytest.raises(ConfigError, match=r"attn\.k_proj: colwise' \(whole: .* and 4 more"):
        check_coverage(model, plan, resolve_plan(model, plan))
    for family, head, fraction in (("flint", "causal", 0.497), ("muse_spark", "image_text", 0.247)):
        model = tiny_plan_model(family, head=head)
        plan = read_plan(model)
        [cov] = layer_coverage(model, plan, resolve_plan(model, plan))
        assert cov.unmatched and not cov.misaddressed, (family, cov.misaddressed)
        assert cov.fraction == pytest.approx(fraction, abs=1e-3), (family, cov.fraction)
        check_coverage(model, plan, resolve_plan(model, plan))
