"""Misuse cases: each is a wrong use of a primitive (or of loading, resuming or exporting weights)
that must raise a SlapoError naming the module path (or the call) and a hint. Shared by
tests/test_misuse.py and scripts/misuse_table.py (which renders docs/errors.md from them).

A case is ``(primitive, description, fn)``; ``fn()`` must raise. Cases in ``TP_CASES`` need two
ranks (tensor-parallel size 2).
"""

from __future__ import annotations

import tempfile

import torch
from torch import nn

import slapo
from slapo.testing import MLP, example_inputs, tiny_model


def _mlp():
    return slapo.create_schedule(MLP())


def _bert():
    return slapo.create_schedule(tiny_model("bert"))


class _TwoArgs(nn.Module):
    def forward(self, x, y):
        return x + y


def _unknown_path():
    _bert()["bert.encoder.layer.0.atention"]


def _replace_function():
    _mlp()["fc1"].replace(torch.relu)


def _replace_signature():
    _mlp()["fc1"].replace(_TwoArgs())


def _replace_same():
    sch = _mlp()
    sch["fc1"].replace(sch["fc1"].mod)


def _replace_all_nothing():
    _mlp().replace_all(nn.Conv2d, lambda path, old: old)


def _replace_all_non_module():
    _mlp().replace_all(nn.Linear, lambda path, old: 3)


def _checkpoint_twice():
    sch = _mlp()
    sch["fc1"].checkpoint()
    sch["fc1"].checkpoint()


def _checkpoint_kv_cache():
    model = tiny_model("gpt2", use_cache=True)
    slapo.create_schedule(model)["transformer.h.0"].checkpoint()
    model(**example_inputs("gpt2"))


def _checkpoint_unknown_policy():
    _mlp()["fc1"].checkpoint(policy="save_matmul")


def _annotate_unknown():
    _mlp()["fc1"].annotate("weigth", "tag", 1)


def _annotate_reserved():
    _mlp()["fc1"].annotate("weight", "grad", 1)


def _shard_unknown():
    _mlp()["fc1"].shard("weigth", axis=0)


def _shard_bad_axis():
    _mlp()["fc1"].shard("weight", axis=5)


def _shard_bad_fused():
    _mlp()["fc1"].shard("weight", axis=0, fused=0)


def _sync_bad_mode():
    _mlp()["fc1"].sync("forward", "all_reduce")


def _sync_bad_op():
    _mlp()["fc1"].sync("fwd_post", "broadcast")


def _sync_reshard_string():
    _mlp()["act"].sync("fwd_post", "RS->SR")


def _trace_original_kwarg():
    _mlp().trace(leaf_modules=["Linear"])


def _fork_rng_unseeded():
    slapo.get_rng_tracker().reset()
    sch = _mlp()
    sch["drop"].fork_rng()
    sch.mod(torch.randn(2, 16))


def _verify_no_reference():
    slapo.verify(_mlp(), (torch.randn(2, 16),))


def _build_unknown_target():
    slapo.build(_mlp(), target="tensorflow")


def _build_meta_without_init():
    with slapo.init_empty_weights():
        model = MLP()
    slapo.build(slapo.create_schedule(model))


def _apply_schedule_unknown_knob():
    from slapo.model_schedule import apply_schedule, register_model_schedule

    register_model_schedule("misuse_mlp")(lambda sch, config, cfg: None)
    apply_schedule(MLP(), "misuse_mlp", ckpt_raito=0.5)


# ------------------------------------------------ weights in and out (docs/hub_checkpoints.md)
_TMP = tempfile.TemporaryDirectory(prefix="slapo-misuse-")  # removed when the process exits


def _new_dir() -> str:
    return tempfile.mkdtemp(dir=_TMP.name)


def _hub_dir(**kw) -> str:
    """A tiny GPT-2 written by ``save_pretrained`` in several shards with an index."""
    path = _new_dir()
    tiny_model("gpt2", seed=3, **kw).save_pretrained(path, max_shard_size="20KB")
    return path


def _last_shard(path: str) -> str:
    import os

    return os.path.join(path, sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))[-1])


def _load_pretrained_truncated():
    import os

    path = _hub_dir()
    with open(_last_shard(path), "r+b") as f:
        f.truncate(os.path.getsize(_last_shard(path)) - 7)
    slapo.load_pretrained(tiny_model("gpt2"), path)


def _load_pretrained_missing_shard():
    import os

    path = _hub_dir()
    os.remove(_last_shard(path))
    slapo.load_pretrained(tiny_model("gpt2"), path)


def _load_pretrained_wrong_shape():
    slapo.load_pretrained(tiny_model("gpt2"), _hub_dir(vocab_size=256))


def _load_pretrained_wrong_dtype():
    from safetensors.torch import load_file, save_file

    path = _hub_dir()
    tensors = load_file(_last_shard(path))
    key = sorted(tensors)[0]
    tensors[key] = tensors[key].long()
    save_file(tensors, _last_shard(path), metadata={"format": "pt"})
    slapo.load_pretrained(tiny_model("gpt2"), path)


def _state_dir(model, optimizer=None) -> str:
    path = _new_dir()
    slapo.save_training_state(path, model, optimizer, step=1)
    return path


def _resume_not_a_state():
    slapo.load_training_state(_new_dir(), MLP())


def _resume_other_shape():
    slapo.load_training_state(_state_dir(MLP()), MLP(ffn=48))


def _resume_without_optimizer():
    model = MLP()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    slapo.load_training_state(_state_dir(model, opt), MLP())


def _save_state_of_meta_model():
    with slapo.init_empty_weights():
        model = MLP()
    _state_dir(model)


def _export_bad_shard_size():
    slapo.export_pretrained(tiny_model("gpt2"), _new_dir(), max_shard_size="5 gigs")


WEIGHT_CASES = [
    ("load_pretrained", "a truncated safetensors file", _load_pretrained_truncated),
    ("load_pretrained", "a shard named by the index is missing", _load_pretrained_missing_shard),
    ("load_pretrained", "a tensor of another shape than the model's", _load_pretrained_wrong_shape),
    ("load_pretrained", "a stored dtype that cannot convert", _load_pretrained_wrong_dtype),
    ("load_training_state", "not a DCP training state", _resume_not_a_state),
    ("load_training_state", "a model of another configuration", _resume_other_shape),
    ("load_training_state", "optimizer state saved, no optimizer given", _resume_without_optimizer),
    ("save_training_state", "a model still on the meta device", _save_state_of_meta_model),
    ("export_pretrained", "a max_shard_size that is not a size", _export_bad_shard_size),
]


CASES = [
    ("schedule", "unknown module path (closest names suggested)", _unknown_path),
    ("replace", "a function instead of a module", _replace_function),
    ("replace", "forward signature the parent cannot call", _replace_signature),
    ("replace", "the module already at the path", _replace_same),
    ("replace_all", "no module of the type", _replace_all_nothing),
    ("replace_all", "make_fn returns a non-module", _replace_all_non_module),
    ("checkpoint", "checkpointing a module twice", _checkpoint_twice),
    ("checkpoint", "checkpointed layer called with a KV cache", _checkpoint_kv_cache),
    ("checkpoint", "unknown selective checkpoint policy", _checkpoint_unknown_policy),
    ("annotate", "unknown parameter", _annotate_unknown),
    ("annotate", "key that would overwrite a tensor attribute", _annotate_reserved),
    ("shard", "unknown parameter", _shard_unknown),
    ("shard", "axis out of range", _shard_bad_axis),
    ("shard", "invalid fused count", _shard_bad_fused),
    ("sync", "unknown mode", _sync_bad_mode),
    ("sync", "unknown op", _sync_bad_op),
    ("sync", "the original's resharding string", _sync_reshard_string),
    ("trace", "an argument of the original's trace", _trace_original_kwarg),
    ("fork_rng", "run without set_random_seed(tp_rank=...)", _fork_rng_unseeded),
    ("verify", "no original model to compare with", _verify_no_reference),
    ("build", "unknown target", _build_unknown_target),
    ("build", "meta weights without init_weights", _build_meta_without_init),
    ("apply_schedule", "unknown knob (closest name suggested)", _apply_schedule_unknown_knob),
    *WEIGHT_CASES,
]


# ----------------------------------------------------------------------------- two ranks
def _tp_indivisible():
    sch = slapo.create_schedule(nn.Sequential(nn.Linear(4, 3)))
    sch["0"].shard("weight", axis=0)


def _tp_double_shard():
    sch = _mlp()
    sch["fc1"].shard("weight", axis=0)
    sch["fc1"].shard("weight", axis=1)


def _tp_all_reduce_partitioned():
    sch = _mlp()
    sch["fc1"].shard(["weight", "bias"], axis=0)
    sch["fc1"].sync("fwd_post", "all_reduce")


def _tp_gather_partial():
    sch = _mlp()
    sch["fc2"].shard("weight", axis=1)
    sch["fc2"].sync("fwd_post", "all_gather", axis=-1)


def _tp_all_to_all_partial():
    sch = _mlp()
    sch["fc2"].shard("weight", axis=1)
    sch["fc2"].sync("fwd_post", "all_to_all", axis=-2)


def _tp_bwd_on_row():
    sch = _mlp()
    sch["fc2"].shard("weight", axis=1)
    sch["fc2"].sync("bwd_post", "all_reduce")


def _tp_fused_qkv_without_fused():
    sch = slapo.create_schedule(tiny_model("gpt2"))
    sch["transformer.h.0.attn.c_attn"].shard(["weight", "bias"], axis=1)


def _tp_verify_missing_reduction():
    ref = MLP()
    sch = slapo.create_schedule(MLP())
    sch["fc1"].shard(["weight", "bias"], axis=0)
    sch["fc1"].sync("bwd_post", "all_reduce")
    sch["fc2"].shard("weight", axis=1)
    slapo.verify(sch, (torch.randn(2, 16),), reference=ref)


TP_CASES = [
    ("shard", "size not divisible by the tensor-parallel size", _tp_indivisible),
    ("shard", "sharding a tensor twice", _tp_double_shard),
    ("sync", "all_reduce on a partitioned output", _tp_all_reduce_partitioned),
    ("sync", "all_gather on a partial-sum output", _tp_gather_partial),
    ("sync", "bwd_post all_reduce on a row-parallel module", _tp_bwd_on_row),
    ("sync", "all_to_all on a partial-sum output", _tp_all_to_all_partial),
    ("shard", "fused q/k/v projection without fused=3", _tp_fused_qkv_without_fused),
    ("verify", "row-parallel output never reduced (rule check)", _tp_verify_missing_reduction),
]


def run_case(fn) -> tuple:
    """``(error class name, message)`` of the error ``fn`` raises (``("", "")`` if none)."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the cases are expected to raise
        return type(e).__name__, str(e), isinstance(e, slapo.SlapoError)
    return "", "", False


def run_tp_cases() -> list:
    """Run every two-rank case (called on each rank)."""
    return [run_case(fn) for _, _, fn in TP_CASES]
