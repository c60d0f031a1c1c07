"""``slapo.load_pretrained``: tiny Hub-format checkpoints (written by ``save_pretrained``) of BERT,
GPT-2, LLaMA, Qwen3 and Qwen3-MoE load into meta models scheduled by the recipes, at 1 rank and at
TP 2 (and EP 2 for the experts), on 4 ranks (slow) at TP 4 and EP 4, with the logits and
gradients of ``from_pretrained``'s model;
bad checkpoints are refused with one line and change nothing."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

import slapo
from slapo.model_schedule import apply_schedule
from slapo.testing import MLP, example_inputs, run_distributed, tiny_config, tiny_model
from slapo.testing.models import tiny_plan_config, tiny_plan_model
from slapo.weights.hub_load import last_read_bytes

# case -> (family, recipe, knobs); qwen3 and qwen3_moe use the "auto" schedule, the MoE once
# with whole experts per rank and once with every expert's packed gate|up split over the ranks
CASES = {
    "bert": ("bert", "bert", {}),
    "gpt2": ("gpt2", "gpt2", {}),
    "llama": ("llama", "llama", {}),
    "qwen3": ("qwen3", "auto", {}),
    "qwen3_moe": ("qwen3_moe", "auto", {"expert_parallel": True}),
    "qwen3_moe_tp": ("qwen3_moe", "auto", {}),
}


def hub_model(family: str, seed: int = 3):
    """A seeded tiny HF model of ``family`` (a config-built stand-in for Hub weights)."""
    if family in ("qwen3", "qwen3_moe"):
        return tiny_plan_model(family, seed=seed)
    return tiny_model(family, seed=seed)


def meta_model(family: str):
    import transformers as tf

    with slapo.init_empty_weights():
        if family in ("qwen3", "qwen3_moe"):
            return tf.AutoModelForCausalLM.from_config(tiny_plan_config(family))
        return type(hub_model(family))(tiny_config(family))


def inputs(family: str):
    out = example_inputs(family)
    out["labels"] = out["input_ids"].masked_fill(out["attention_mask"] == 0, -100)
    return out


def write_hub(tmp, families=None, max_shard_size=None):
    """``save_pretrained`` each family into ``tmp/<family>`` (several shards when asked)."""
    for fam in families or sorted({c[0] for c in CASES.values()}):
        kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
        hub_model(fam).save_pretrained(os.path.join(tmp, fam), **kw)


def run_loaded(case: str, path: str, group=None):
    """Schedule a meta model with the case's recipe, load the checkpoint, build; return the
    full logits and the full gradient of the word embedding after one backward."""
    from slapo.verification.tools import to_full

    family, recipe, knobs = CASES[case]
    model = meta_model(family)
    sch = apply_schedule(model, recipe, group=group, **knobs)
    slapo.load_pretrained(sch, path)
    model, _ = slapo.build(sch)
    out = model(**inputs(family))
    out.loss.backward()
    emb = model.get_input_embeddings().weight
    return (to_full(out.logits.detach(), group, like=reference(family, path)[0], param=None),
            to_full(emb.grad, group, emb.grad, param=emb), out.loss.detach())


def reference(family: str, path: str):
    """``from_pretrained``'s logits, embedding gradient and loss (cached per path)."""
    import transformers as tf

    if path not in _REFS:
        model = tf.AutoModelForMaskedLM.from_pretrained(path) if family == "bert" else \
            tf.AutoModelForCausalLM.from_pretrained(path)
        model.train()
        out = model(**inputs(family))
        out.loss.backward()
        _REFS[path] = (out.logits.detach(), model.get_input_embeddings().weight.grad,
                       out.loss.detach())
    return _REFS[path]


_REFS: dict = {}


def compare(family: str, path: str, got) -> None:
    want = reference(family, path)
    for what, a, b in zip(("logits", "embedding grad", "loss"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5,
                                   msg=lambda m, w=what: f"{family} {w}: {m}")


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen3_moe"])
def test_one_rank_matches_from_pretrained(tmp_path, family):
    write_hub(str(tmp_path), [family])
    path = str(tmp_path / family)
    compare(family, path, run_loaded(family, path))


def _tp2(tmp: str):
    out = {}
    for case, (fam, recipe, knobs) in CASES.items():
        path = os.path.join(tmp, fam)
        got = run_loaded(case, path)
        want = reference(fam, path)
        out[case] = [float((a - b).abs().max()) for a, b in zip(got, want)]
        model = meta_model(fam)
        slapo.load_pretrained(apply_schedule(model, recipe, **knobs), path)
        held = sum(p.numel() for p in model.parameters())
        whole = hub_model(fam).parameters()
        out[case].append(held / sum(p.numel() for p in whole))
        out[case].append(last_read_bytes() / stored_bytes(path))
    out["padded"] = padded_vocab(os.path.join(tmp, "llama"))
    return out


def stored_bytes(path: str) -> int:
    from slapo.weights.hub_files import read_hub_directory

    return sum(t.numel * t.dtype.itemsize for t in read_hub_directory(path).values())


def padded_vocab(path: str) -> float:
    """LLaMA with its vocabulary padded from 128 to 132 rows (66 per rank at TP 2): the first
    128 logits are ``from_pretrained``'s, the padded rows are zeros."""
    import transformers as tf
    from slapo.verification.tools import to_full

    with slapo.init_empty_weights():
        model = tf.LlamaForCausalLM(tiny_config("llama", vocab_size=132))
    sch = apply_schedule(model, "llama", vocab_parallel_loss=False)
    slapo.load_pretrained(sch, path)
    model, _ = slapo.build(sch)
    head = model.lm_head.weight
    full = to_full(head.detach(), None, head, param=head)
    assert torch.count_nonzero(full[128:]) == 0 and torch.count_nonzero(full[:128]) > 0
    logits = model(**inputs("llama")).logits.detach()
    want = reference("llama", path)[0]
    return float((logits[..., :128] - want).abs().max())


def test_tp2_and_ep2_match_from_pretrained(tmp_path):
    write_hub(str(tmp_path), max_shard_size="20KB")  # several shards + index
    assert os.path.isfile(tmp_path / "llama" / "model.safetensors.index.json")
    for rank, res in enumerate(run_distributed(_tp2, 2, str(tmp_path), timeout=240)):
        assert res.pop("padded") < 2e-5, (rank, "padded vocabulary")
        for fam, (logits, grad, loss, held, read) in res.items():
            assert logits < 2e-5 and grad < 2e-5 and loss < 2e-5, (rank, fam, res[fam])
            assert held < 0.8, (rank, fam, held)  # each rank holds its shards only
            assert read < 0.8, (rank, fam, read)  # and reads about as much


# ------------------------------------------------------------------------------- refusals
def snapshot(model):
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def test_bad_checkpoints_are_refused_and_nothing_changes(tmp_path):
    good = str(tmp_path / "good")
    hub_model("llama").save_pretrained(good, max_shard_size="20KB")
    index = json.load(open(os.path.join(good, "model.safetensors.index.json")))
    last = sorted(set(index["weight_map"].values()))[-1]

    def refused(match, mutate=None, model=None):
        d = str(tmp_path / f"case{refused.n}")
        refused.n += 1
        shutil.copytree(good, d)
        if mutate:
            mutate(d)
        model = model or tiny_model("llama", seed=7)
        before = snapshot(model)
        with pytest.raises(slapo.CheckpointIOError, match=match) as info:
            slapo.load_pretrained(model, d)
        assert "\n" not in str(info.value)
        for n, t in model.state_dict().items():
            assert torch.equal(t, before[n]), n

    refused.n = 0
    refused(rf"'{last}' is truncated", lambda d: open(os.path.join(d, last), "r+b").truncate(
        os.path.getsize(os.path.join(d, last)) - 7))
    refused(rf"shard '{last}' named by model.safetensors.index.json is missing",
            lambda d: os.remove(os.path.join(d, last)))
    refused(r"'model.embed_tokens.weight' in the checkpoint has shape \[128, 32\] but the "
            r"model's 'model.embed_tokens.weight' is \[128, 48\]",
            model=tiny_model("llama", hidden_size=48, num_attention_heads=4))
    refused(r"'lm_head.weight' is stored as int64 but the model's 'lm_head.weight' is "
            r"float32 \(mismatched dtype\)", lambda d: _retype(d, "lm_head.weight"))
    refused(r"not in the checkpoint: 'model.norm.weight'", lambda d: _drop(d, "model.norm.weight"))
    refused(r"fit no tensor of the model: 'model.extra'",
            lambda d: _add(d, "model.extra", torch.zeros(3)))
    refused(r"no \*.safetensors file", lambda d: [os.remove(os.path.join(d, f))
                                                   for f in os.listdir(d)])
    # a dtype the header declares that its bytes contradict
    refused(r"holds .* bytes \(mismatched dtype or shape\)", lambda d: _lie_dtype(d))
    # floating dtypes convert: a bf16 checkpoint loads into fp32 like from_pretrained's
    model = tiny_model("llama", seed=7)
    half = str(tmp_path / "bf16")
    hub_model("llama").to(torch.bfloat16).save_pretrained(half)
    slapo.load_pretrained(model, half)
    w = hub_model("llama").to(torch.bfloat16).model.embed_tokens.weight.float()
    assert torch.equal(model.model.embed_tokens.weight, w)
    with pytest.raises(slapo.CheckpointIOError, match="expected a model or a Schedule"):
        slapo.load_pretrained(3, good)
    with pytest.raises(slapo.CheckpointIOError, match="is not a directory"):
        slapo.load_pretrained(MLP(), str(tmp_path / "nowhere"))


def _rewrite(d, fn):
    from safetensors.torch import load_file, save_file

    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    for fname in sorted(set(index["weight_map"].values())):
        tensors = load_file(os.path.join(d, fname))
        changed = fn(tensors, fname, index)
        if changed:
            save_file(tensors, os.path.join(d, fname), metadata={"format": "pt"})
    json.dump(index, open(os.path.join(d, "model.safetensors.index.json"), "w"))


def _retype(d, key):
    def fn(tensors, fname, index):
        if key in tensors:
            tensors[key] = tensors[key].long()
            return True
    _rewrite(d, fn)


def _drop(d, key):
    def fn(tensors, fname, index):
        if key in tensors:
            del tensors[key]
            del index["weight_map"][key]
            return True
    _rewrite(d, fn)


def _add(d, key, value):
    def fn(tensors, fname, index):
        if not index["weight_map"].get(key):
            tensors[key] = value
            index["weight_map"][key] = fname
            return True
    _rewrite(d, fn)


def _lie_dtype(d):
    """Edit one header entry's dtype from F32 to F16 (same length string) in place."""
    fname = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))[0]
    path = os.path.join(d, fname)
    data = bytearray(open(path, "rb").read())
    at = data.find(b'"dtype":"F32"')
    assert at > 0
    data[at:at + 13] = b'"dtype":"F16"'
    open(path, "wb").write(bytes(data))


# ------------------------------------------------------------------------- pipeline stages
def _pp2(path: str):
    """LLaMA cut into 2 pipeline stages by its recipe: loaded before build (the schedule) and
    after build (this rank's stage only, its slices only); the first step's loss."""
    import torch.distributed as dist
    import transformers as tf

    solo, _ = dist.new_subgroups(group_size=1)  # no tensor parallelism: PP 2
    out = {}
    for when in ("before_build", "after_build"):
        with slapo.init_empty_weights():
            model = tf.LlamaForCausalLM(tiny_config("llama", num_hidden_layers=4))
        sch = apply_schedule(model, "llama", group=solo, pipeline_cuts=[1],
                             example_inputs=example_inputs("llama", batch=4))
        if when == "before_build":
            slapo.load_pretrained(sch, path)
        built, _ = slapo.build(sch, target="torch", n_microbatches=2, init_weights=True,
                               optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
        if when == "after_build":
            slapo.load_pretrained(built.module, path)
            out["read"] = last_read_bytes() / stored_bytes(path)
        out[when] = built.train_step(example_inputs("llama", batch=4, seed=1))
    return out


def test_pp2_stages_load_their_layers(tmp_path):
    import transformers as tf

    path = str(tmp_path / "llama4")
    tiny_model("llama", seed=3, num_hidden_layers=4).save_pretrained(path)
    want = tf.LlamaForCausalLM.from_pretrained(path)(
        **example_inputs("llama", batch=4, seed=1)).loss.item()
    for rank, res in enumerate(run_distributed(_pp2, 2, path, timeout=240)):
        assert res["before_build"] == pytest.approx(want, rel=1e-5), (rank, res)
        assert res["after_build"] == pytest.approx(want, rel=1e-5), (rank, res)
        assert res["read"] < 0.75, (rank, res)  # a stage reads its own layers


# ----------------------------------------------------------------------------- 4 ranks (slow)
def _tp4(tmp: str, cases):
    return {case: [float((a - b).abs().max()) for a, b in zip(
        run_loaded(case, os.path.join(tmp, CASES[case][0])),
        reference(CASES[case][0], os.path.join(tmp, CASES[case][0])))] for case in cases}


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SLAPO_SLOW_TESTS") != "1",
                    reason="4 ranks: ~1-2 min on 2 shared cores; set SLAPO_SLOW_TESTS=1")
def test_tp4_matches_from_pretrained(tmp_path):
    cases = ["bert", "gpt2"]  # 4 heads (the tiny MoE has 2 kv heads: no TP 4)
    write_hub(str(tmp_path), sorted({CASES[c][0] for c in cases}))
    for rank, res in enumerate(run_distributed(_tp4, 4, str(tmp_path), cases, timeout=500)):
        for case, diffs in res.items():
            assert max(diffs) < 2e-5, (rank, case, diffs)


EP4 = dict(num_key_value_heads=4)  # 4 heads over 4 kv heads: attention at TP 4 beside EP 4


def _ep4(path: str):
    """Qwen3-MoE (4 experts) under the "auto" schedule with expert parallelism over 4 ranks (one
    whole expert per rank, attention at TP 4), loaded on the meta device from ``path``: the
    full logits, the word embedding's full gradient and the loss, and the share of the expert
    weights this rank holds and of the checkpoint's bytes it read."""
    import transformers as tf
    from slapo.verification.tools import to_full

    with slapo.init_empty_weights():
        model = tf.AutoModelForCausalLM.from_config(tiny_plan_config("qwen3_moe", **EP4))
    sch = apply_schedule(model, "auto", expert_parallel=True)
    slapo.load_pretrained(sch, path)
    read = last_read_bytes() / stored_bytes(path)
    model, _ = slapo.build(sch)
    out = model(**inputs("qwen3_moe"))
    out.loss.backward()
    emb = model.get_input_embeddings().weight
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    whole = sum(p.numel() for n, p in tiny_plan_model("qwen3_moe", **EP4).named_parameters()
                if ".experts." in n)
    like = torch.empty(*out.logits.shape[:-1], 128)
    return (to_full(out.logits.detach(), None, like=like), to_full(emb.grad, None, emb.grad,
                                                                    param=emb),
            out.loss.detach(), experts / whole, read)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SLAPO_SLOW_TESTS") != "1",
                    reason="4 ranks: ~1-2 min on 2 shared cores; set SLAPO_SLOW_TESTS=1")
def test_ep4_moe_matches_from_pretrained(tmp_path):
    import transformers as tf

    path = str(tmp_path / "qwen3_moe")
    tiny_plan_model("qwen3_moe", seed=3, **EP4).save_pretrained(path, max_shard_size="20KB")
    ref = tf.AutoModelForCausalLM.from_pretrained(path).train()
    out = ref(**inputs("qwen3_moe"))
    out.loss.backward()
    want = (out.logits.detach(), ref.get_input_embeddings().weight.grad, out.loss.detach())
    for rank, res in enumerate(run_distributed(_ep4, 4, path, timeout=500)):
        for what, a, b in zip(("logits", "embedding grad", "loss"), res[:3], want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5,
                                       msg=lambda m, w=what, r=rank: f"rank {r} {w}: {m}")
        assert res[3] == 0.25, (rank, "expert share")  # one of 4 experts per rank
        assert res[4] < 0.5, (rank, "bytes read")
