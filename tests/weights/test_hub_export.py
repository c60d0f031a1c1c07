"""``slapo.export_pretrained``: a scheduled model (renamed, fused, sharded at TP 2 / EP 2, or
pipelined in 2 stages) written back as a HuggingFace checkpoint that ``from_pretrained`` loads
with the same logits, after a training step changed the weights; size-sharded files with an
index; the stored layout is the one ``save_pretrained`` writes (same keys, shapes and, before
training, the same bytes)."""

from __future__ import annotations

import json
import os

import pytest
import torch

import slapo
from slapo.model_schedule import apply_schedule
from slapo.testing import run_distributed
from tests.weights.test_hub_load import CASES, hub_model, inputs, meta_model, write_hub

TOL = dict(rtol=1e-4, atol=2e-5)


def auto_class(family: str):
    import transformers as tf

    return tf.AutoModelForMaskedLM if family == "bert" else tf.AutoModelForCausalLM


def stored(path: str):
    from safetensors.torch import load_file

    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, f)))
    return out


def export_after_step(case: str, src: str, dst: str, group=None):
    """Load ``src`` into the case's scheduled model, take one SGD step, export to ``dst``;
    return the step's model's full logits on fresh inputs."""
    from slapo.verification.tools import to_full

    family, recipe, knobs = CASES[case]
    model = meta_model(family)
    sch = apply_schedule(model, recipe, group=group, **knobs)
    slapo.load_pretrained(sch, src)
    model, _ = slapo.build(sch)
    slapo.export_pretrained(model, dst + "-untrained", max_shard_size="20KB")
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(**inputs(family)).loss.backward()
    opt.step()
    model.eval()
    logits = model(**inputs(family)).logits.detach()
    slapo.export_pretrained(model, dst, max_shard_size="20KB")
    like = torch.empty(*logits.shape[:-1], hub_model(family).config.vocab_size)
    return to_full(logits, group, like=like)


def check_exported(family: str, src: str, dst: str, logits: torch.Tensor) -> None:
    # before training: exactly what save_pretrained wrote (keys, shapes, bytes)
    want, got = stored(src), stored(dst + "-untrained")
    assert sorted(got) == sorted(want)
    for k, t in want.items():
        assert torch.equal(got[k], t), k
    # after training: from_pretrained gives the trained sharded model's logits
    assert os.path.isfile(os.path.join(dst, "model.safetensors.index.json"))
    index = json.load(open(os.path.join(dst, "model.safetensors.index.json")))
    assert len(set(index["weight_map"].values())) > 1 and os.path.isfile(
        os.path.join(dst, "config.json"))
    model = auto_class(family).from_pretrained(dst).eval()
    torch.testing.assert_close(model(**inputs(family)).logits, logits, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("case", ["gpt2", "qwen3_moe"])
def test_one_rank_export_round_trip(tmp_path, case):
    family = CASES[case][0]
    write_hub(str(tmp_path), [family])
    src, dst = str(tmp_path / family), str(tmp_path / f"{case}-out")
    check_exported(family, src, dst, export_after_step(case, src, dst))


def _tp2(tmp: str, cases):
    out = {}
    for case in cases:
        family = CASES[case][0]
        src, dst = os.path.join(tmp, family), os.path.join(tmp, f"{case}-out")
        out[case] = export_after_step(case, src, dst)
    return out


def test_tp2_export_loads_with_from_pretrained(tmp_path):
    cases = ["bert", "llama", "qwen3_moe", "qwen3_moe_tp"]
    write_hub(str(tmp_path), sorted({CASES[c][0] for c in cases}))
    results = run_distributed(_tp2, 2, str(tmp_path), cases, timeout=240)
    for case in cases:
        family = CASES[case][0]
        torch.testing.assert_close(results[0][case], results[1][case])
        check_exported(family, str(tmp_path / family), str(tmp_path / f"{case}-out"),
                       results[0][case])


def test_paper_families_load_and_export_on_one_rank(tmp_path):
    """The other families of the paper, each under its recipe (op-library attention: renamed
    and fused parameters): load -> same logits as from_pretrained; export -> from_pretrained
    gives the scheduled model's logits."""
    from slapo.testing import example_inputs, tiny_config, tiny_model

    for family in ("roberta", "albert", "gpt_neo", "opt", "t5"):
        src = tiny_model(family, seed=3)
        path, out = str(tmp_path / family), str(tmp_path / f"{family}-out")
        src.save_pretrained(path)
        cls = type(src)
        with slapo.init_empty_weights():
            model = cls(tiny_config(family))
        sch = apply_schedule(model, family, model_config=model.config)
        slapo.load_pretrained(sch, path)
        model, _ = slapo.build(sch)
        data = example_inputs(family)
        got = model.eval()(**data).logits
        want = cls.from_pretrained(path).eval()(**data).logits
        torch.testing.assert_close(got, want, **TOL, msg=lambda m, f=family: f"{f} {m}")
        slapo.export_pretrained(model, out)
        back = cls.from_pretrained(out).eval()(**data).logits
        torch.testing.assert_close(back, got, **TOL, msg=lambda m, f=family: f"{f} {m}")


# ------------------------------------------------------------------------- pipeline stages
def _pp2_export(tmp: str):
    """LLaMA and GPT-2 (4 layers) cut into 2 stages by their recipes (op-library attention: a
    fused qkv; GPT-2's lm_head tied to wte across the stages), loaded from ``tmp/<family>``,
    exported untrained; LLaMA trained one SGD step and exported again."""
    import torch.distributed as dist
    import transformers as tf

    from slapo.testing import example_inputs, tiny_config

    solo, _ = dist.new_subgroups(group_size=1)  # no tensor parallelism: PP 2
    out = {}
    for family, cls in (("gpt2", tf.GPT2LMHeadModel), ("llama", tf.LlamaForCausalLM)):
        layers = {"n_layer" if family == "gpt2" else "num_hidden_layers": 4}
        with slapo.init_empty_weights():
            model = cls(tiny_config(family, **layers))
        sch = apply_schedule(model, family, group=solo, pipeline_cuts=[1],
                             example_inputs=example_inputs(family, batch=4))
        slapo.load_pretrained(sch, os.path.join(tmp, family))
        built, _ = slapo.build(sch, target="torch", n_microbatches=1,
                               optimizer=lambda p: torch.optim.SGD(p, lr=0.5))
        dst = os.path.join(tmp, f"{family}-out")
        slapo.export_pretrained(built, dst + "-untrained", max_shard_size="20KB")
        out[family] = sorted(n for n, _ in built.named_parameters())
    out["loss"] = built.train_step(example_inputs("llama", batch=4, seed=1))
    slapo.export_pretrained(built, dst, max_shard_size="20KB")
    return out


def test_pp2_export_gathers_the_stages(tmp_path):
    import transformers as tf

    from slapo.testing import example_inputs, tiny_model

    for family, layers in (("gpt2", "n_layer"), ("llama", "num_hidden_layers")):
        tiny_model(family, seed=3, **{layers: 4}).save_pretrained(str(tmp_path / family))
    results = run_distributed(_pp2_export, 2, str(tmp_path), timeout=300)
    for family in ("gpt2", "llama"):
        held = [set(r[family]) for r in results]
        assert held[0] and held[1] and not held[0] & held[1] - {"lm_head.weight"}  # one stage
        # untrained: exactly what save_pretrained wrote (keys, shapes, bytes; tied once)
        want = stored(str(tmp_path / family))
        got = stored(str(tmp_path / f"{family}-out-untrained"))
        assert sorted(got) == sorted(want), family
        for k, t in want.items():
            assert torch.equal(got[k], t), (family, k)
    # trained: from_pretrained gives the logits of the same SGD step on the unpipelined model
    src, dst = str(tmp_path / "llama"), str(tmp_path / "llama-out")
    ref = tf.LlamaForCausalLM.from_pretrained(src)
    loss = ref(**example_inputs("llama", batch=4, seed=1)).loss
    assert results[0]["loss"] == pytest.approx(loss.item(), rel=1e-5)
    loss.backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.5 * p.grad
    probe = example_inputs("llama", batch=2, seed=7)
    back = tf.LlamaForCausalLM.from_pretrained(dst).eval()(**probe).logits
    torch.testing.assert_close(back, ref.eval()(**probe).logits, **TOL)
    index = json.load(open(os.path.join(dst, "model.safetensors.index.json")))
    assert len(set(index["weight_map"].values())) > 1
