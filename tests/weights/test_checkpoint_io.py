"""The older checkpoint format (``manifest.json``), still read: manifest, resharding round trips,
refusal of bad checkpoints; ``slapo.save_checkpoint`` is a deprecated wrapper that warns once and
writes a DCP state, which ``load_checkpoint`` reads at another layout."""

import json
import os

import pytest
import torch
from torch import nn

import slapo
from slapo.weights.delayed_init import materialize
from slapo.sharding import get_shard_spec
from slapo.testing import MLP, run_distributed, tiny_model
from slapo.weights.checkpoint_io import write_legacy_checkpoint


def gpt2(seed=0, meta=True):
    with slapo.init_empty_weights(enable=meta):
        model = tiny_model("gpt2")
    return materialize(model, True, device="cpu", seed=seed) if meta else model


def snapshot(model):
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def assert_same(model, state):
    for name, t in model.state_dict().items():
        assert torch.equal(t, state[name]), name


def test_single_process_round_trip_and_manifest(tmp_path):
    src = gpt2(seed=0)
    path = write_legacy_checkpoint(src, str(tmp_path))
    manifest = json.load(open(path))
    assert manifest["format"] == "slapo-checkpoint" and manifest["version"] == 1
    assert manifest["world_size"] == 1 and list(manifest["files"]) == ["rank-00000-of-00001.pt"]
    wte = manifest["tensors"]["transformer.wte.weight"]
    assert wte["aliases"] == ["lm_head.weight"] and wte["dtype"] == "float32"
    assert wte["shape"] == [128, 32] and len(wte["pieces"][0]["sha256"]) == 64
    dst = gpt2(seed=1)
    assert not torch.equal(dst.transformer.wte.weight, src.transformer.wte.weight)
    slapo.load_checkpoint(slapo.create_schedule(dst), str(tmp_path))
    assert_same(dst, snapshot(src))
    assert dst.lm_head.weight is dst.transformer.wte.weight


def _corrupt_bytes(path, needle: bytes):
    data = bytearray(open(path, "rb").read())
    at = data.find(needle)
    assert at >= 0
    data[at] ^= 0xFF
    open(path, "wb").write(bytes(data))


def test_bad_checkpoints_are_refused_and_nothing_is_loaded(tmp_path):
    src = MLP()
    good = str(tmp_path / "good")
    write_legacy_checkpoint(src, good)
    fname = os.path.join(good, "rank-00000-of-00001.pt")
    raw = open(fname, "rb").read()
    manifest = open(os.path.join(good, "manifest.json")).read()

    def refused(match, mutate=None, model=None):
        d = tmp_path / f"case{refused.n}"
        refused.n += 1
        d.mkdir()
        (d / "rank-00000-of-00001.pt").write_bytes(raw)
        (d / "manifest.json").write_text(manifest)
        if mutate:
            mutate(str(d))
        model = model or MLP()
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(7.0)
        before = snapshot(model)
        with pytest.raises(slapo.CheckpointIOError, match=match):
            slapo.load_checkpoint(model, str(d))
        assert_same(model, before)  # nothing loaded

    refused.n = 0

    def edit_manifest(fn):
        def mutate(d):
            m = json.load(open(os.path.join(d, "manifest.json")))
            fn(m)
            json.dump(m, open(os.path.join(d, "manifest.json"), "w"))
        return mutate

    last = src.fc2.bias.detach().numpy().tobytes()  # the last tensor: the others pass first
    refused("checksum mismatch for piece fc2.bias", lambda d: _corrupt_bytes(
        os.path.join(d, "rank-00000-of-00001.pt"), last))
    refused("has .* bytes but the manifest says.*truncated", lambda d: open(
        os.path.join(d, "rank-00000-of-00001.pt"), "r+b").truncate(len(raw) - 100))
    refused("is missing", lambda d: os.remove(os.path.join(d, "rank-00000-of-00001.pt")))
    refused("no manifest.json", lambda d: os.remove(os.path.join(d, "manifest.json")))
    refused("unreadable or corrupt", lambda d: open(os.path.join(d, "manifest.json"), "w")
            .write("{not json"))
    refused("version 99 is not supported", edit_manifest(lambda m: m.update(version=99)))
    refused(r"missing from the checkpoint: 'fc2.bias'",
            edit_manifest(lambda m: m["tensors"].pop("fc2.bias")))
    refused(r"in the checkpoint but not in the model: 'extra'",
            edit_manifest(lambda m: m["tensors"].update(extra=m["tensors"]["fc1.bias"])))
    refused(r"'fc1.weight' has global shape \[48, 16\] in the model but \[32, 16\]",
            model=MLP(ffn=48))
    refused(r"'fc1.weight' is float64 in the model but float32", model=MLP().double())
    refused("do not cover the whole tensor", edit_manifest(
        lambda m: m["tensors"]["fc1.weight"]["pieces"][0].update(axis=0, start=0, length=16)))
    with slapo.init_empty_weights():
        meta = MLP()
    with pytest.raises(slapo.CheckpointIOError, match="meta device.*Hint: build"):
        write_legacy_checkpoint(meta, str(tmp_path / "x"))
    with pytest.raises(slapo.CheckpointIOError, match="meta device"):
        slapo.load_checkpoint(meta, good)
    with pytest.raises(slapo.CheckpointIOError, match="expected a model"):
        write_legacy_checkpoint(3, good)


def test_tie_mismatch_is_refused(tmp_path):
    untied = gpt2()
    untied.lm_head.weight = nn.Parameter(untied.lm_head.weight.detach().clone())
    write_legacy_checkpoint(untied, str(tmp_path))
    with pytest.raises(slapo.CheckpointIOError, match="ties .* stores .* separately"):
        slapo.load_checkpoint(gpt2(), str(tmp_path))


# ----------------------------------------------------------------------------- 2 gloo ranks
def _tp_gpt2(layout):
    """A meta tiny GPT-2 sharded at TP=2 with ``layout`` ("col" or "alt"), then built."""
    with slapo.init_empty_weights():
        model = tiny_model("gpt2")
    sch = slapo.create_schedule(model)
    sch["transformer.wte"].shard("weight", axis=0 if layout == "col" else 1)
    for i in range(2):
        sch[f"transformer.h.{i}.attn.c_attn"].shard(["weight", "bias"], axis=1, fused=3)
        sch[f"transformer.h.{i}.attn.c_proj"].shard("weight", axis=0)
        if layout == "col":
            sch[f"transformer.h.{i}.mlp.c_fc"].shard(["weight", "bias"], axis=1)
            sch[f"transformer.h.{i}.mlp.c_proj"].shard("weight", axis=0)
        else:
            sch[f"transformer.h.{i}.mlp.c_proj"].shard(["weight", "bias"], axis=1)
    model, _ = slapo.build(sch, init_weights=True, device="cpu", init_seed=5)
    return model


def _local(model):
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def _round_trip(tmp):
    import torch.distributed as dist

    rank = dist.get_rank()
    a, b = os.path.join(tmp, "tp2"), os.path.join(tmp, "tp1")
    src = _tp_gpt2("col")
    saved = _local(src)
    write_legacy_checkpoint(src, a)  # TP=2
    solo = dist.new_group([0])
    if rank == 0:  # TP=1 in a world of one: load, save again
        full = gpt2(seed=9)
        slapo.load_checkpoint(full, a, group=solo)
        write_legacy_checkpoint(full, b, group=solo)
    dist.barrier()
    out = {}
    for tag, layout in (("same", "col"), ("other_axes", "alt")):
        dst = _tp_gpt2(layout)
        for p in dst.parameters():
            p.data.zero_()
        slapo.load_checkpoint(dst, b)  # TP=1 -> TP=2
        ref = gpt2(seed=5)  # unsharded reference with the same init seed
        bad = []
        for n, t in dst.state_dict().items():
            spec = get_shard_spec(dict(dst.named_parameters(remove_duplicate=False))[n]) \
                if n in dict(dst.named_parameters(remove_duplicate=False)) else None
            expect = spec.slice_of(ref.state_dict()[n]) if spec else ref.state_dict()[n]
            if not torch.equal(t, expect) or (layout == "col" and not torch.equal(t, saved[n])):
                bad.append(n)
        out[tag] = bad
    # a piece only rank 1 reads is corrupt: both ranks refuse, neither loads anything
    if rank == 1:
        path = os.path.join(a, "rank-00001-of-00002.pt")
        needle = src.transformer.h[1].mlp.c_fc.weight.detach().numpy().tobytes()
        data = bytearray(open(path, "rb").read())
        data[data.find(needle) + 5] ^= 0xFF  # inside one of rank 1's own pieces
        open(path, "wb").write(bytes(data))
    dist.barrier()
    dst = _tp_gpt2("col")
    before = _local(dst)
    try:
        slapo.load_checkpoint(dst, a)
        out["refused"] = None
    except slapo.CheckpointIOError as exc:
        out["refused"] = str(exc)
    out["untouched"] = all(torch.equal(t, before[n]) for n, t in dst.state_dict().items())
    return out


def test_tp2_to_tp1_to_tp2_round_trip_is_bit_exact(tmp_path):
    results = run_distributed(_round_trip, 2, str(tmp_path), timeout=180)
    for rank, res in enumerate(results):
        assert res["same"] == [] and res["other_axes"] == [], (rank, res)
        assert res["refused"] and res["untouched"], (rank, res)
    assert "rank 1 refused" in results[0]["refused"]
    assert "checksum mismatch for piece transformer.h.1.mlp.c_fc.weight" in results[1]["refused"]
    # the TP=2 checkpoint (before corruption, re-saved at TP=1) loads in a plain process
    full = gpt2(seed=3)
    slapo.load_checkpoint(full, str(tmp_path / "tp1"))
    assert_same(full, snapshot(gpt2(seed=5)))
    manifest = json.load(open(tmp_path / "tp2" / "manifest.json"))
    assert manifest["world_size"] == 2 and len(manifest["files"]) == 2
    c_fc = manifest["tensors"]["transformer.h.0.mlp.c_fc.weight"]["pieces"]
    assert [(p["axis"], p["start"], p["length"]) for p in c_fc] == [(1, 0, 32), (1, 32, 32)]


# ------------------------------------------------------- the deprecated save_checkpoint wrapper
def test_save_checkpoint_warns_once_and_writes_a_dcp_state(tmp_path):
    import warnings

    import slapo.weights.checkpoint_io as io

    io._warned = False  # another test of this process may have warned already
    src = gpt2(seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert slapo.save_checkpoint(src, str(tmp_path / "a")) == str(tmp_path / "a")
        slapo.save_checkpoint(src, str(tmp_path / "b"))
    retired = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert len(retired) == 1, [str(w.message) for w in caught]
    message = str(retired[0].message)
    assert "save_training_state" in message and "python -m slapo.weights.convert" in message
    assert "\n" not in message
    # new saves go through DCP: no manifest.json, a .metadata that load_training_state reads
    assert sorted(os.listdir(tmp_path / "a")) == [".metadata", "__0_0.distcp"]
    dst = gpt2(seed=1)
    assert not torch.equal(dst.transformer.wte.weight, src.transformer.wte.weight)
    slapo.load_checkpoint(dst, str(tmp_path / "a"))
    assert_same(dst, snapshot(src))
    other = gpt2(seed=2)
    assert slapo.load_training_state(str(tmp_path / "b"), other).step == 0
    assert_same(other, snapshot(src))


def _wrapper_reshards(tmp):
    """A TP=2 model saved through the wrapper loads into TP=2 with other axes; a subgroup is
    refused (DCP saves over all ranks)."""
    import torch.distributed as dist

    path = os.path.join(tmp, "tp2")
    src = _tp_gpt2("col")
    solo = [dist.new_group([r]) for r in range(2)][dist.get_rank()]
    with pytest.raises(slapo.CheckpointIOError, match="other than the default one"):
        slapo.save_checkpoint(src, path, group=solo)
    slapo.save_checkpoint(src, path, group=dist.group.WORLD)
    dst = _tp_gpt2("alt")
    for p in dst.parameters():
        p.data.zero_()
    slapo.load_checkpoint(dst, path)
    ref = gpt2(seed=5)
    params = dict(dst.named_parameters(remove_duplicate=False))
    bad = []
    for n, t in dst.state_dict().items():
        spec = get_shard_spec(params[n]) if n in params else None
        if not torch.equal(t, spec.slice_of(ref.state_dict()[n]) if spec else ref.state_dict()[n]):
            bad.append(n)
    return bad


def test_wrapper_state_reshards_on_two_ranks(tmp_path):
    assert run_distributed(_wrapper_reshards, 2, str(tmp_path), timeout=180) == [[], []]
