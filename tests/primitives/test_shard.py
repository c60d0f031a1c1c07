"""``shard``: rules per module type, tied weights, fused q/k/v, meta tensors, error messages."""

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

import slapo
from slapo.sharding import ShardSpec, check_layouts, get_shard_spec
from slapo.testing import MLP, tiny_model
from tests.sharding.helpers import spawn_checks, train_and_compare


def _mlp_column_row():
    torch.manual_seed(0)
    ref = MLP(16, 32)
    model = copy.deepcopy(ref)
    sch = slapo.create_schedule(model)
    sch["fc1"].annotate("weight", "my_tag", 7)
    sch["fc1"].shard(["weight", "bias"], axis=0)
    sch["fc1"].sync("bwd_post", "all_reduce")
    sch["fc2"].shard("weight", axis=1)
    sch["fc2"].sync("fwd_post", "all_reduce")
    assert check_layouts(sch) == []
    rank = dist.get_rank()
    assert model.fc1.out_features == 16 and model.fc1.in_features == 16  # in_features untouched
    assert model.fc2.in_features == 16 and model.fc2.out_features == 16
    w = model.fc1.weight
    assert w.my_tag == 7 and "slapo_shard" in sch.param_tags and "my_tag" in sch.param_tags
    assert get_shard_spec(w) == ShardSpec(0, 2, rank, (32, 16))
    assert type(model.fc2).__name__ == "LinearWithSync"
    assert model.fc2.bias is sch["fc2"].mod.bias and model.fc2.weight.shape == (16, 16)
    # gathering the shards gives back the full tensor
    parts = [torch.empty_like(w) for _ in range(2)]
    dist.all_gather(parts, w.detach())
    torch.testing.assert_close(get_shard_spec(w).join(parts), ref.fc1.weight)
    x = torch.randn(4, 3, 16)
    train_and_compare(ref, model, (x,), steps=3)
    return True




class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 4, 1, bias=False)
        self.emb = nn.Embedding(10, 6)
        self.head = nn.Linear(6, 4)

    def forward(self, x, ids):
        y = self.conv2(torch.relu(self.bn(self.conv1(x))))
        return y.mean(dim=(2, 3)) + self.head(self.emb(ids)).mean(dim=1)


def _conv_bn_embedding_meta():
    torch.manual_seed(0)
    ref = ConvNet()
    model = copy.deepcopy(ref)
    sch = slapo.create_schedule(model)
    sch["conv1"].shard(["weight", "bias"], axis=0)
    sch["conv1"].sync("bwd_post", "all_reduce")
    sch["bn"].shard(["weight", "bias", "running_mean", "running_var"], axis=0)
    sch["conv2"].shard("weight", axis=1)
    sch["conv2"].sync("fwd_post", "all_reduce")
    sch["emb"].shard("weight", axis=1)  # embedding dim: output partitioned on the last axis
    sch["emb"].sync("fwd_post", "all_gather", axis=-1)
    assert check_layouts(sch) == []
    assert (model.conv1.out_channels, model.bn.num_features, model.conv2.in_channels) == (4, 4, 4)
    assert model.emb.embedding_dim == 3 and model.bn.running_mean.shape == (4,)
    x, ids = torch.randn(2, 3, 5, 5), torch.randint(0, 10, (2, 7))
    train_and_compare(ref, model, (x, ids), steps=3)
    rank = dist.get_rank()
    torch.testing.assert_close(model.bn.running_mean, ref.bn.running_mean[rank * 4:rank * 4 + 4])

    # meta tensors: sharded without allocating, specs recorded
    with slapo.init_empty_weights():
        meta = MLP(16, 32)
    msch = slapo.create_schedule(meta)
    msch["fc1"].shard(["weight", "bias"], axis=0)
    assert meta.fc1.weight.is_meta and meta.fc1.weight.shape == (16, 16)
    assert get_shard_spec(meta.fc1.bias) == ShardSpec(0, 2, rank, (32,))
    return True




def _tied_and_errors():
    from slapo import ShardError

    # tied weights: naming only lm_head shards the shared Parameter once, for both modules
    model = tiny_model("gpt2")
    sch = slapo.create_schedule(model)
    sch["lm_head"].shard("weight", axis=0)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.transformer.wte.weight.shape == (64, 32)
    assert model.transformer.wte.num_embeddings == 64 and model.lm_head.out_features == 64
    assert sch["transformer.wte"].metadata["shard"].layout.output.kind == "partial"
    sch["transformer.wte"].shard("weight", axis=0)  # the other side of the tie: a no-op
    assert model.transformer.wte.weight.shape == (64, 32)
    with pytest.raises(ShardError, match=r"'weight' is already sharded \(axis 0, 2 ranks\)"):
        sch["lm_head"].shard("weight", axis=0)
    # a call that fails changes nothing, not even the tie's mark: the tied side stays a no-op
    model = tiny_model("gpt2")
    sch = slapo.create_schedule(model)
    sch["lm_head"].shard("weight", axis=0)
    with pytest.raises(ShardError, match="'nope'"):
        sch.shard(["transformer.wte.weight", "nope"], axis=0)
    sch["transformer.wte"].shard("weight", axis=0)
    assert model.transformer.wte.weight.shape == (64, 32)

    cases = 0

    def expect(pattern, fn):
        nonlocal cases
        with pytest.raises(ShardError, match=pattern):
            fn()
        cases += 1

    odd = slapo.create_schedule(tiny_model("gpt2", vocab_size=127))
    expect(r"^shard\('weight', axis=0\) on 'lm_head' \(Linear 32->127\): 127 is not divisible "
           r"by the tensor-parallel size 2\. Hint: pad vocab_size to a multiple of 2\.$",
           lambda: odd["lm_head"].shard("weight", axis=0))
    gpt = slapo.create_schedule(tiny_model("gpt2"))
    attn = "transformer.h.0.attn"
    expect(r"no parameter or buffer named 'weigth'.*did you mean 'weight'",
           lambda: gpt[f"{attn}.c_proj"].shard("weigth", axis=0))
    expect(r"no parameter or buffer named 'c_attn.wieght'.*did you mean 'c_attn.weight'",
           lambda: gpt[attn].shard("c_attn.wieght", axis=1))
    expect(r"fuses 3 projections.*Hint: pass fused=3",
           lambda: gpt[f"{attn}.c_attn"].shard(["weight", "bias"], axis=1))
    expect(r"96 is not divisible by 3 fused parts x tensor-parallel size 2|not divisible",
           lambda: gpt[f"{attn}.c_attn"].shard("bias", axis=0, fused=5))
    expect(r"bias cannot be sharded when the weight is sharded on its input axis",
           lambda: gpt[f"{attn}.c_proj"].shard(["weight", "bias"], axis=0))
    expect(r"axis 2 is out of range for 'weight' of shape \(32, 96\)",
           lambda: gpt[f"{attn}.c_attn"].shard("weight", axis=2))
    expect(r"names must be a str or a list of str", lambda: gpt[attn].shard(3, axis=0))
    expect(r"axis must be an int", lambda: gpt[f"{attn}.c_proj"].shard("weight", axis="0"))
    assert gpt[f"{attn}.c_proj"].mod.weight.shape == (32, 32)  # failed calls changed nothing

    mlp = slapo.create_schedule(MLP(16, 32))
    expect(r"bias of a row-sharded layer is not sharded.*Hint: shard only 'weight'",
           lambda: mlp["fc2"].shard(["weight", "bias"], axis=1))
    mlp["fc2"].shard("weight", axis=1)
    expect(r"bias cannot be sharded", lambda: mlp["fc2"].shard("bias", axis=0))
    expect(r"already sharded", lambda: mlp["fc2"].shard("weight", axis=1))
    expect(r"axis 2 is out of range", lambda: mlp["fc1"].shard("weight", axis=2))

    llama = slapo.create_schedule(tiny_model("llama", num_key_value_heads=1))
    expect(r"'k_proj' has 1 heads of size 8, which cannot be split over 2 ranks",
           lambda: llama["model.layers.0.self_attn.k_proj"].shard("weight", axis=0))

    conv = slapo.create_schedule(ConvNet())
    expect(r"axis 1 is out of range for 'weight' of shape \(8,\)",
           lambda: conv["bn"].shard(["weight", "bias", "running_mean", "running_var"], axis=1))
    grouped = slapo.create_schedule(nn.Sequential(nn.Conv2d(4, 4, 1, groups=2)))
    expect(r"grouped convolutions", lambda: grouped["0"].shard("weight", axis=0))

    # incomplete / unsynchronised shards are reported by check_layouts
    net = slapo.create_schedule(nn.Sequential(MLP(16, 32), MLP(16, 32)))
    net["0.fc1"].shard("weight", axis=0)   # bias left whole
    net["0.fc2"].shard("weight", axis=1)   # never reduced
    net["1.fc1"].shard(["weight", "bias"], axis=0)
    net["1.fc2"].shard("weight", axis=1)
    net["1"].sync("fwd_post", "all_reduce")  # reduced only after fc2's bias was added
    problems = check_layouts(net)
    texts = " | ".join(str(p) for p in problems)
    assert "'0.fc1': the weight is sharded on its output axis but the bias is whole" in texts
    assert "'0.fc2': its output is a partial sum that is never reduced" in texts
    assert "'1.fc2': its partial output is reduced only by '1'" in texts
    assert "'0.fc1': the gradient of its input is a partial sum that is never all-reduced" in texts
    assert len(problems) == 5, texts
    return cases


@pytest.fixture(scope="module")
def two_ranks():
    """All 2-rank checks of this file in one spawn (a spawn costs seconds)."""
    return spawn_checks([_mlp_column_row, _conv_bn_embedding_meta, _tied_and_errors])


def test_mlp_column_then_row_matches_reference(two_ranks):
    assert two_ranks["_mlp_column_row"] == [True, True]


def test_conv_batchnorm_embedding_and_meta(two_ranks):
    assert two_ranks["_conv_bn_embedding_meta"] == [True, True]


def test_tied_weights_and_shard_errors(two_ranks):
    assert two_ranks["_tied_and_errors"] == [16, 16]  # error cases checked on each rank


def test_single_process_schedule_replays_from_history():
    torch.manual_seed(0)
    ref = MLP(16, 32)
    model = copy.deepcopy(ref)
    sch = slapo.create_schedule(model)
    sch["fc1"].shard(["weight", "bias"], axis=0)
    sch["fc1"].sync("bwd_post", "all_reduce")
    sch["fc2"].shard("weight", axis=1)
    sch["fc2"].sync("fwd_post", "all_reduce")
    code = str(sch.history)
    assert "sch['fc2'].shard('weight', axis=1)" in code and "sync('fwd_post', 'all_reduce')" in code
    replayed = sch.history.replay(copy.deepcopy(ref))
    assert type(replayed.mod.fc2).__name__ == "LinearWithSync"
    x = torch.randn(3, 16)
    torch.testing.assert_close(model(x), ref(x))  # one rank: collectives are identities
    torch.testing.assert_close(replayed.mod(x), ref(x))
    assert get_shard_spec(replayed.mod.fc1.weight) == ShardSpec(0, 1, 0, (32, 16))


@pytest.mark.parametrize("axis, parts", [(0, 1), (1, 1), (0, 3)])
def test_a_shard_owns_its_storage(axis, parts):
    """A rank's chunk is a copy the size of the chunk: a view of an axis-0 slice would keep the
    whole tensor alive on every rank (8 ranks of OPT-2.7B held 3.5 GB of weights, not 0.7)."""
    full = torch.randn(48, 16)
    spec = ShardSpec(axis=axis, world_size=8 if parts == 1 else 2, rank=1,
                     global_shape=(48, 16), parts=parts)
    chunk = spec.slice_of(full)
    assert chunk.untyped_storage().nbytes() == chunk.numel() * chunk.element_size()
    assert chunk.untyped_storage().data_ptr() != full.untyped_storage().data_ptr()
    assert torch.equal(spec.join([spec.slice_of(full) if r == 1 else
                                  ShardSpec(axis, spec.world_size, r, (48, 16), parts)
                                  .slice_of(full) for r in range(spec.world_size)]), full)
