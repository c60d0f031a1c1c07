"""``TensorLog``: an identity that logs shape, dtype and statistics on every rank. Inserted into a
traced graph (``insert_log``) and by subgraph ``replace``, the model trains exactly as the
unscheduled one (outputs and gradients, 1 and 2 gloo ranks, with tensor-parallel shards), and
the log lines carry the rank, the path and the right numbers."""

import copy
import logging
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import slapo
from slapo.errors import OpError
from slapo.op import TensorLog, insert_log, tensor_summary
from slapo.testing import run_distributed
from tests.sharding.helpers import train_and_compare


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Top(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = MLP()
        self.out = nn.Identity()

    def forward(self, x):
        return self.out(self.mlp(x) + x)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _stat(line: str, key: str) -> float:
    return float(re.search(rf"\b{key}=(\S+)", line).group(1))


def _logged_training():
    rank, n = dist.get_rank(), dist.get_world_size()
    lines = _Lines()
    logging.getLogger("slapo.debug").addHandler(lines)
    logging.getLogger("slapo.debug").setLevel(logging.INFO)
    torch.manual_seed(0)
    ref = Top()
    model = copy.deepcopy(ref)
    x = torch.randn(2, 4, 8)
    sch = slapo.create_schedule(model)
    sch["mlp.fc1"].shard(["weight", "bias"], axis=0)
    sch["mlp.fc2"].shard("weight", axis=1)
    sch["mlp.fc2"].sync("fwd_post", "all_reduce")  # fc2 becomes a LinearWithSync: a leaf
    sch["mlp"].sync("bwd_post", "all_reduce")
    mlp = sch["mlp"]
    mlp.trace(example_inputs=(x,))
    # into the traced graph, after fc1 (its gradient too) ...
    insert_log(mlp, mlp.find("fc1")[0], grad=True)
    # ... by subgraph replace: gelu -> gelu + log ...
    mlp.replace(nn.Sequential(nn.GELU(), TensorLog("after gelu")), mlp.find(lambda x: F.gelu(x)))
    # ... and by whole-module replace of an identity
    sch["out"].replace(TensorLog("model output"))
    with torch.no_grad():  # before the training step changes the weights
        h = ref.mlp.fc1(x).chunk(n, dim=-1)[rank]
        out = ref(x)
    lines.lines.clear()
    train_and_compare(ref, model, (x,), steps=1)
    logged = list(lines.lines)

    # the numbers in the log are those of the tensors (this rank's shard of fc1's output)
    fwd = [ln for ln in logged if "mlp:fc1 forward" in ln]
    assert len(fwd) == 1, logged  # one step: one forward of the scheduled model
    assert fwd[0].startswith(f"[rank {rank}/{n}] mlp:fc1 forward: shape=(2, 4, {16 // n}) "
                             "dtype=float32 ")
    for key, value in (("mean", h.mean()), ("max", h.max()), ("norm", h.norm())):
        assert _stat(fwd[0], key) == pytest.approx(value.item(), rel=1e-4)
    assert "nan=0 inf=0" in fwd[0]
    assert sum("mlp:fc1 backward: shape=" in ln for ln in logged) == 1
    assert sum("after gelu forward" in ln for ln in logged) == 1
    (final,) = [ln for ln in logged if "model output forward" in ln][:1]
    assert _stat(final, "mean") == pytest.approx(out.mean().item(), rel=1e-4)
    return n


@pytest.mark.parametrize("world_size", [1, 2])
def test_tensor_log_keeps_training_and_logs_every_rank(world_size):
    assert run_distributed(_logged_training, world_size) == [world_size] * world_size


def test_identity_outputs_gradients_and_printer():
    printed = []
    log = TensorLog("probe", grad=True, printer=printed.append)
    x = torch.randn(3, 4, requires_grad=True)
    y = log(x)
    torch.testing.assert_close(y, x)
    (y * 3).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))
    assert printed[0].startswith("[rank 0/1] probe forward: shape=(3, 4) dtype=float32 mean=")
    assert printed[1].startswith("[rank 0/1] probe backward: shape=(3, 4)")
    assert _stat(printed[1], "mean") == pytest.approx(3.0)
    # without grad=True the very input object comes back; tuples keep their other items
    assert TensorLog(printer=printed.append)(x) is x
    a, b = TensorLog(printer=printed.append)((x, 5))
    assert a is x and b == 5
    assert "nan=1 inf=1" in tensor_summary(torch.tensor([1.0, float("nan"), float("inf")]))
    assert tensor_summary(torch.tensor([3, 1])) == "shape=(2,) dtype=int64 min=1 max=3"
    assert TensorLog(ranks=[1], printer=printed.append)(x) is x and len(printed) == 4


def test_tensor_log_is_a_tracing_leaf_and_errors_name_the_fix():
    model = Top()
    sch = slapo.create_schedule(model)
    sch["out"].replace(TensorLog("out"))
    sch.trace(example_inputs=(torch.randn(2, 8),))
    assert isinstance(model.out, TensorLog)  # not traced into
    with pytest.raises(OpError, match=r"no value 'nope'.*Hint: pass a subgraph"):
        insert_log(sch, "nope")
    with pytest.raises(OpError, match=r"not traced.*Hint: call sch\['mlp.fc1'\].trace"):
        insert_log(sch["mlp.fc1"], "x")
