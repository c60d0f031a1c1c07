"""Selective (op-level) checkpointing, ``checkpoint(policy=...)``: the same training as the
unscheduled model (dropout included), less kept than without checkpointing and more than with
whole-module checkpointing, the kept matmuls really not recomputed, and the errors.

Memory is counted as the bytes of the storages the forward creates that are still alive when it
returns (a dispatch mode with a weak reference per storage, as the simulator's recorder does):
selective checkpointing keeps its tensors in PyTorch's checkpoint storage, not through autograd's
saved-tensor hooks, so ``saved_tensors_hooks`` would see none of them. Two-rank (TP) training with
the ``ckpt_policy`` knob: tests/model_schedule/test_ckpt_policy.py.
"""

import gc
import weakref

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

import slapo
from slapo.runtime.checkpoint_policy import (ATTENTION_OPS, MATMUL_OPS, POLICIES, SavePolicy,
                                             _SaveChooser)
from slapo.testing import MLP, assert_same_training, example_inputs, tiny_model
from tests.primitives.test_checkpoint import DROPOUT, LAYERS, ForkedDropout

POLICY_CHOICES = ["save_matmuls", "save_every_other_matmul", SavePolicy(attention=False)]


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class LiveStorages(TorchDispatchMode):
    """Bytes of the storages that ops create while the mode is on and that are still alive."""

    def __init__(self):
        super().__init__()
        self.live = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage()._cdata for t in _tensors((args, kwargs))}
        for t in _tensors(out):
            storage = t.untyped_storage()
            key = storage._cdata
            if key not in inputs and key not in self.live:
                self.live[key] = storage.nbytes()
                weakref.finalize(storage, self.live.pop, key, None)
        return out

    def bytes(self) -> int:
        gc.collect()
        return sum(self.live.values())


class CountMatmuls(TorchDispatchMode):
    """How many matmuls (``aten.mm``/``aten.addmm``) run while the mode is on."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in MATMUL_OPS
        return func(*args, **(kwargs or {}))


def llama_with(policy):
    """A tiny LLaMA whose layers are checkpointed: not at all (``"none"``), whole (None), or
    selectively with ``policy``."""
    model = tiny_model("llama", use_cache=False)
    if policy != "none":
        sch = slapo.create_schedule(model)
        for i in range(2):
            sch[f"model.layers.{i}"].checkpoint(**({} if policy is None else {"policy": policy}))
    return model


def kept_bytes_and_recomputed_matmuls(policy):
    """(bytes kept after the forward, matmuls run in the backward) of ``llama_with(policy)``."""
    model, inputs = llama_with(policy), example_inputs("llama")
    with LiveStorages() as live:
        out = model(**inputs)
    kept = live.bytes()
    with CountMatmuls() as matmuls:
        out.loss.backward()
    return kept, matmuls.count


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
@pytest.mark.parametrize("policy", POLICY_CHOICES, ids=str)
def test_selective_checkpoint_same_numerics_under_dropout(family, policy):
    ref = tiny_model(family, **DROPOUT[family])
    model = tiny_model(family, **DROPOUT[family])
    keys_before = list(model.state_dict())
    sch = slapo.create_schedule(model)
    for i in range(2):
        sch[f"{LAYERS[family]}.{i}"].checkpoint(policy=policy)
    assert list(model.state_dict()) == keys_before
    assert_same_training(ref, model, example_inputs(family), seed=7, atol=1e-6, rtol=1e-6)


def test_selective_checkpoint_keeps_less_than_none_more_than_full():
    none, full = kept_bytes_and_recomputed_matmuls("none"), kept_bytes_and_recomputed_matmuls(None)
    every = kept_bytes_and_recomputed_matmuls("save_matmuls")
    other = kept_bytes_and_recomputed_matmuls("save_every_other_matmul")
    # memory: no checkpointing > every matmul kept > every second one kept > whole layers
    assert none[0] > every[0] > other[0] > full[0], (none, every, other, full)
    # recomputation: kept matmuls are not run again in backward; whole layers rerun them all
    assert every[1] == none[1] < other[1] < full[1], (none, every, other, full)


def test_policy_is_what_the_layer_runs_with():
    """A policy that keeps nothing but attention kernels recomputes every matmul, as whole-layer
    checkpointing does: the count above is the policy's doing, not an artifact of the test."""
    full = kept_bytes_and_recomputed_matmuls(None)[1]
    attention_only = kept_bytes_and_recomputed_matmuls(SavePolicy(matmuls=False))[1]
    assert attention_only == full


def test_selective_checkpoint_restores_tracker_streams():
    ref, model = ForkedDropout(), ForkedDropout()
    model.load_state_dict(ref.state_dict())
    slapo.create_schedule(model).checkpoint(policy="save_matmuls")
    results = []
    for m in (ref, model):
        slapo.set_random_seed(123, tp_rank=1)
        out = m(torch.randn(4, 8))
        out.sum().backward()
        results.append((out.detach(), m.lin.weight.grad.clone(),
                        slapo.get_rng_tracker().get_states()["model-parallel-rng"]["cpu"]))
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=0)
    slapo.get_rng_tracker().reset()


def test_attention_kernel_with_dropout_is_recomputed():
    """Kept, a random kernel would be skipped in the recomputation and shift every later draw."""
    q = torch.randn(1, 2, 4, 8)
    for op in ATTENTION_OPS:
        dropout_at = [a.name for a in op._schema.arguments].index("dropout_p")
        args = [q, q, q] + [0.0] * (dropout_at - 3)
        chooser = _SaveChooser(POLICIES["save_matmuls"])
        ctx = SelectiveCheckpointContext(is_recompute=False)
        assert chooser(ctx, op, *args, 0.0) == CheckpointPolicy.MUST_SAVE, op
        assert chooser(ctx, op, *args, 0.1) == CheckpointPolicy.PREFER_RECOMPUTE, op
    assert ATTENTION_OPS and MATMUL_OPS


def test_every_other_matmul_counts_per_call():
    chooser = _SaveChooser(POLICIES["save_every_other_matmul"])
    ctx = SelectiveCheckpointContext(is_recompute=False)
    mm = torch.ops.aten.mm.default
    kept = [chooser(ctx, mm) == CheckpointPolicy.MUST_SAVE for _ in range(5)]
    assert kept == [True, False, True, False, True]
    relu = torch.ops.aten.relu.default
    assert chooser(ctx, relu) == CheckpointPolicy.PREFER_RECOMPUTE


def test_policy_in_history_and_metadata():
    model = MLP()
    sch = slapo.create_schedule(model)
    sch["fc1"].checkpoint(policy="save_every_other_matmul")
    assert "sch['fc1'].checkpoint(policy='save_every_other_matmul')" in str(sch.history)
    assert sch["fc1"].metadata["checkpoint_policy"] == SavePolicy(matmul_every=2)
    replayed = sch.history.replay(MLP())
    assert replayed["fc1"].metadata["checkpoint_policy"] == SavePolicy(matmul_every=2)


@pytest.mark.parametrize("policy,match", [
    ("save_matmul", r"checkpoint\(policy='save_matmul'\) on 'fc1' \(Linear 16->32\): unknown "
                    r"checkpoint policy 'save_matmul'\. Hint: did you mean 'save_matmuls'\?"),
    (2, r"policy must be a preset's name or a slapo.SavePolicy, got int\. Hint:"),
])
def test_bad_policy_is_an_error(policy, match):
    with pytest.raises(slapo.CheckpointError, match=match):
        slapo.create_schedule(MLP())["fc1"].checkpoint(policy=policy)


@pytest.mark.parametrize("fields,match", [
    (dict(matmul_every=0), r"matmul_every must be an integer >= 1, got 0\. Hint: 1 keeps"),
    (dict(matmul_every=1.5), r"matmul_every must be an integer >= 1, got 1\.5"),
    (dict(matmuls=1), r"matmuls must be True or False, got 1\. Hint"),
    (dict(matmuls=False, attention=False), r"keeps no op's output\. Hint: call checkpoint\(\)"),
])
def test_bad_save_policy_is_an_error(fields, match):
    with pytest.raises(slapo.CheckpointError, match=match):
        SavePolicy(**fields)


def test_policy_with_a_subgraph_is_refused():
    model = tiny_model("bert")
    sch = slapo.create_schedule(model)
    sch["bert.encoder.layer.1.attention"].trace(example_inputs=example_inputs("bert"))
    found = sch["bert.encoder.layer.1.attention.self"].find("query")
    with pytest.raises(slapo.CheckpointError, match=r"on 'bert.encoder.layer.1.attention.self'"
                       r".*a selective policy applies to a whole module.*Hint: checkpoint the "
                       r"subgraph without a policy"):
        sch["bert.encoder.layer.1.attention.self"].checkpoint(found[0], policy="save_matmuls")
    sch["bert.encoder.layer.0"].checkpoint(policy="save_matmuls")
    with pytest.raises(slapo.CheckpointError, match="already checkpointed"):
        sch["bert.encoder.layer.0"].checkpoint()


class TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.nn.functional.dropout(torch.tanh(self.a(x)), 0.5, self.training))


def test_selective_checkpoint_of_a_plain_module_matches():
    ref, model = TwoLinears(), TwoLinears()
    model.load_state_dict(ref.state_dict())
    slapo.create_schedule(model).checkpoint(policy=SavePolicy(matmul_every=2))
    x = torch.randn(4, 8, requires_grad=True)
    assert_same_training(ref, model, (x,), seed=5, atol=0, rtol=0)
