"""Stop and resume a training run exactly, on ``torch.distributed.checkpoint`` (DCP).

:func:`save_training_state` writes the whole state a run needs to continue as if never stopped:
the model's parameters and persistent buffers, the optimizer's state (sharded like its
parameters) and hyper-parameters, the step, the LR scheduler, the data position (anything
picklable the caller keeps, e.g. the index of the next batch), and each rank's random number
generators (torch CPU / CUDA, Python, NumPy, and Slapo's named streams, the model-parallel one
included: :func:`slapo.get_rng_tracker`).

Slapo's shards are described to DCP: a tensor with a :class:`~slapo.sharding.ShardSpec` is
handed over as a ``ShardedTensor`` whose local shards are *views* of this rank's regions of the
global tensor (one region, or one per block of a fused ``q|k|v`` axis), so DCP stores global
chunks with their offsets and any other layout reads them back: TP=a -> TP=b, TP -> one
process, or FSDP2's ``DTensor`` s (the keys are the parameter names under ``model.``). Loading
writes into the model's and the optimizer's tensors in place.

The RNG states are per rank (``rng.rank<r>``); a run resumed at another world size keeps its
own generators (it cannot be bit-exact anyway).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import random
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from ..errors import CheckpointIOError
from ..runtime.rng import get_rng_tracker
from ..sharding.spec import ShardSpec, get_shard_spec
from .checkpoint_format import model_tensors, regions_of

__all__ = ["TrainingState", "save_training_state", "load_training_state"]

FORMAT = "slapo-training-state"


@dataclasses.dataclass
class TrainingState:
    """What :func:`load_training_state` restored besides the tensors: the ``step``, the
    caller's ``data_position`` and ``extra``, the world size that saved it, and whether this
    rank's RNG states were restored (``rng_restored``: False at another world size)."""

    step: int
    data_position: Any = None
    extra: Any = None
    saved_world_size: int = 1
    rng_restored: bool = False


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _describe(t: torch.Tensor, spec: Optional[ShardSpec],
              copy_back: Optional[List[Any]] = None) -> Any:
    """``t`` as DCP should see it: a ``ShardedTensor`` of its regions when sharded. A region
    that is not contiguous in ``t`` (a block of a fused axis other than the first, e.g. GPT-2's
    ``c_attn`` split along its columns) is handed over as a contiguous copy; when loading,
    ``(view, copy)`` is appended to ``copy_back`` to be written into ``t`` afterwards."""
    if spec is None or spec.world_size == 1 or not _distributed():
        return t.detach()  # same storage: DCP loads into it in place
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import (ShardedTensorMetadata,
                                                                  TensorProperties)

    rank, world = dist.get_rank(), dist.get_world_size()
    device = "cpu" if t.device.type == "cpu" else f"{t.device.type}:{t.device.index or 0}"
    shards, everyone = [], []
    for r in range(spec.world_size):  # ShardedTensor checks that the shards tile the tensor
        # where rank r of the shard group lives only matters for this rank's own shards
        owner = rank if r == spec.rank else (rank - spec.rank + r) % world
        for region in regions_of(dataclasses.replace(spec, rank=r)):
            assert region.axis is not None  # a sharded tensor's regions have an axis
            offsets = [0] * t.dim()
            offsets[region.axis] = region.start
            sizes = list(spec.local_shape)
            sizes[region.axis] = region.length
            meta = ShardMetadata(offsets, sizes, f"rank:{owner}/{device}")
            everyone.append(meta)
            if r == spec.rank:
                piece = t.detach().narrow(region.axis, region.local_start, region.length)
                if not piece.is_contiguous():  # ShardedTensor takes contiguous shards only
                    view, piece = piece, piece.contiguous()
                    if copy_back is not None:
                        copy_back.append((view, piece))
                shards.append(Shard(piece, meta))
    props = TensorProperties(dtype=t.dtype, layout=torch.strided, requires_grad=False,
                             memory_format=torch.contiguous_format, pin_memory=False)
    global_meta = ShardedTensorMetadata(everyone,
                                        torch.Size(spec.global_shape), props)
    return ShardedTensor._init_from_local_shards_and_global_metadata(shards, global_meta)


def _model_entries(model: nn.Module, copy_back: Optional[List[Any]] = None) -> Dict[str, Any]:
    return {mt.names[0]: _describe(mt.tensor, mt.spec, copy_back)
            for mt in model_tensors(model)}


def _param_names(model: nn.Module) -> Dict[int, str]:
    return {id(mt.tensor): mt.names[0] for mt in model_tensors(model)}


def _optimizer_entries(model: nn.Module, optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    """Per parameter (by name) its optimizer state: tensors shaped like the parameter are
    sharded like it; everything else (scalars) as is."""
    names = _param_names(model)
    out: Dict[str, Any] = {}
    for p, state in optimizer.state.items():
        name = names.get(id(p))
        if name is None:
            raise CheckpointIOError("the optimizer holds a parameter that is not the model's",
                                    call="save_training_state",
                                    hint="pass the model whose parameters the optimizer updates")
        for k, v in state.items():
            shaped = isinstance(v, torch.Tensor) and v.shape == p.shape and v.dim() > 0
            out[f"{name}.{k}"] = _describe(v, get_shard_spec(p)) if shaped else v
    return out


def _groups(model: nn.Module, optimizer: torch.optim.Optimizer) -> List[dict]:
    """The param groups' hyper-parameters, parameters named instead of indexed."""
    names = _param_names(model)
    return [{**{k: v for k, v in g.items() if k != "params"},
             "params": [names[id(p)] for p in g["params"]]} for g in optimizer.param_groups]


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "slapo": get_rng_tracker().get_states(), "slapo_seeds": dict(
                 get_rng_tracker().seeds)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy is a dependency of torch's wheels
        pass
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    tracker = get_rng_tracker()
    tracker.set_states(state["slapo"])
    tracker.seeds = dict(state["slapo_seeds"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


def save_training_state(directory: str, model: nn.Module,
                        optimizer: Optional[torch.optim.Optimizer] = None, *, step: int = 0,
                        scheduler: Any = None, data_position: Any = None, extra: Any = None,
                        async_save: bool = False) -> Any:
    """Write the run's state into ``directory`` (a DCP checkpoint) so that
    :func:`load_training_state` continues it exactly. Every rank must call it.

    Args:
        model: the built model (its shards are described to DCP, see the module docs).
        optimizer: its state is saved per parameter name, sharded like the parameter.
        step: the number of optimizer steps taken.
        scheduler: an LR scheduler (anything with ``state_dict``/``load_state_dict``).
        data_position: where the data loader stands (picklable; returned on load).
        extra: anything else picklable to keep with the state.
        async_save: return at once with a future (``dcp.async_save``); the state is copied
            first, so training may go on while it is written.

    Returns:
        the DCP metadata, or with ``async_save`` a future to ``.result()`` before the next save.
    """
    import torch.distributed.checkpoint as dcp

    from ..schedule import Schedule

    model = model.mod if isinstance(model, Schedule) else model
    meta = [mt.names[0] for mt in model_tensors(model) if mt.tensor.is_meta]
    if meta:
        raise CheckpointIOError(f"'{meta[0]}' is still on the meta device",
                                call="save_training_state",
                                hint="build the model (slapo.build) before saving it")
    rank = dist.get_rank() if _distributed() else 0
    world = dist.get_world_size() if _distributed() else 1
    state: Dict[str, Any] = {"model": _model_entries(model)}
    train = {"format": FORMAT, "step": int(step), "data_position": data_position,
             "extra": extra, "world_size": world,
             "scheduler": scheduler.state_dict() if scheduler is not None else None}
    if optimizer is not None:
        state["optim"] = _optimizer_entries(model, optimizer)
        train["param_groups"] = _groups(model, optimizer)
    state["train"] = pickle.dumps(train)
    state[f"rng.rank{rank}"] = pickle.dumps(_rng_state())
    os.makedirs(directory, exist_ok=True)
    kw = dict(checkpoint_id=directory, no_dist=not _distributed())
    if async_save:
        return dcp.async_save(state, **kw)  # type: ignore[arg-type]
    return dcp.save(state, **kw)  # type: ignore[arg-type]


def _fail(what: str, hint: str) -> CheckpointIOError:
    return CheckpointIOError(what, call="load_training_state", hint=hint)


def load_training_state(directory: str, model: nn.Module,
                        optimizer: Optional[torch.optim.Optimizer] = None,
                        scheduler: Any = None) -> TrainingState:
    """Restore a state written by :func:`save_training_state` into ``model`` (any layout:
    another TP degree reshards), ``optimizer`` (a fresh one is fine: its state is created) and
    ``scheduler``, and this rank's RNG generators. Every rank must call it.

    Returns:
        the :class:`TrainingState` (step, data position, extra) to continue from.

    Raises:
        CheckpointIOError: (before anything is loaded) not a DCP checkpoint of a training
            state, a model tensor missing from it or of another global shape, optimizer state
            saved but no optimizer given, or param groups that name other parameters.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from ..schedule import Schedule

    model = model.mod if isinstance(model, Schedule) else model
    try:
        md = dcp.FileSystemReader(directory).read_metadata().state_dict_metadata
    except Exception as exc:  # any unreadable directory gets one line
        raise _fail(f"'{directory}' is not a readable DCP checkpoint ({type(exc).__name__})",
                    "pass a directory written by slapo.save_training_state") from exc
    if "train" not in md:
        raise _fail(f"'{directory}' holds no training state (no 'train' entry)",
                    "pass a directory written by slapo.save_training_state; convert a "
                    "save_checkpoint directory with python -m slapo.weights.convert")
    rank = dist.get_rank() if _distributed() else 0
    meta = [mt.names[0] for mt in model_tensors(model) if mt.tensor.is_meta]
    if meta:
        raise _fail(f"'{meta[0]}' is on the meta device",
                    "build the model (slapo.build) before loading a training state into it")
    copy_back: List[Any] = []  # non-contiguous regions loaded into copies
    state: Dict[str, Any] = {"model": _model_entries(model, copy_back)}
    for mt in model_tensors(model):
        entry = md.get(f"model.{mt.names[0]}")
        if not isinstance(entry, TensorStorageMetadata):
            raise _fail(f"model tensor '{mt.names[0]}' is not in '{directory}'",
                        "resume with the model that was saved")
        if tuple(entry.size) != tuple(mt.global_shape):
            raise _fail(f"'{mt.names[0]}' has global shape {list(mt.global_shape)} but "
                        f"{list(entry.size)} in '{directory}'",
                        "resume with the model configuration that was saved")
    optim_keys = [k[len("optim."):] for k in md if k.startswith("optim.")]
    if optim_keys and optimizer is None:
        raise _fail(f"'{directory}' holds optimizer state but no optimizer was given",
                    "pass the optimizer (a fresh one is fine)")
    slots = _optimizer_slots(model, optimizer, optim_keys, md,
                             copy_back) if optimizer is not None else {}
    no_dist = not _distributed()
    head: Dict[str, Any] = {"train": b""}
    dcp.load(head, checkpoint_id=directory, no_dist=no_dist)
    train = pickle.loads(head["train"])
    if optimizer is not None:
        _check_groups(model, optimizer, train.get("param_groups") or [])
    if slots:
        state["optim"] = {k: v[3] for k, v in slots.items()}
    rng_key = f"rng.rank{rank}"
    world = dist.get_world_size() if _distributed() else 1
    if rng_key in md and train.get("world_size", 1) == world:  # same ranks: same generators
        state[rng_key] = b""
    dcp.load(state, checkpoint_id=directory, no_dist=no_dist)
    with torch.no_grad():
        for view, loaded in copy_back:
            view.copy_(loaded)
    if optimizer is not None:
        for key, (p, k, holder, _) in slots.items():
            optimizer.state[p][k] = holder if holder is not None else state["optim"][key]
        for group, old in zip(optimizer.param_groups, train.get("param_groups") or []):
            group.update({k: v for k, v in old.items() if k != "params"})
    if scheduler is not None and train.get("scheduler") is not None:
        scheduler.load_state_dict(train["scheduler"])
    if rng_key in state:
        _set_rng_state(pickle.loads(state[rng_key]))
    return TrainingState(train["step"], train.get("data_position"), train.get("extra"),
                         train.get("world_size", 1), rng_key in state)


def _optimizer_slots(model: nn.Module, optimizer: torch.optim.Optimizer, keys: List[str],
                     md: Dict[str, Any], copy_back: List[Any]) -> Dict[str, Any]:
    """``{key: (param, state name, holder)}``: where each saved optimizer entry goes; tensors
    are allocated like their parameter (and sharded like it), other values are placeholders."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    by_name = {mt.names[0]: mt for mt in model_tensors(model)}
    out: Dict[str, Any] = {}
    for key in keys:
        name, _, k = key.rpartition(".")
        mt = by_name.get(name)
        if mt is None:
            raise _fail(f"optimizer state for '{name}', which the model does not have",
                        "resume with the model that was saved")
        entry = md[f"optim.{key}"]
        if not isinstance(entry, TensorStorageMetadata):  # a Python value, loaded as is
            out[key] = (mt.tensor, k, None, b"")
        elif tuple(entry.size) == tuple(mt.global_shape) and len(entry.size) > 0:
            # zeros_like: this rank's part (a DTensor for an FSDP2 parameter)
            holder = torch.zeros_like(mt.tensor.detach(), dtype=entry.properties.dtype)
            out[key] = (mt.tensor, k, holder, _describe(holder, mt.spec, copy_back))
        else:  # e.g. Adam's step count: replicated
            holder = torch.zeros(tuple(entry.size), dtype=entry.properties.dtype)
            out[key] = (mt.tensor, k, holder, holder)
    return out


def _check_groups(model: nn.Module, optimizer: torch.optim.Optimizer,
                  saved: List[dict]) -> None:
    names = _param_names(model)
    if len(saved) != len(optimizer.param_groups):
        raise _fail(f"the optimizer has {len(optimizer.param_groups)} param groups but "
                    f"{len(saved)} were saved", "build the optimizer as in the saved run")
    for group, old in zip(optimizer.param_groups, saved):
        if [names[id(p)] for p in group["params"]] != old["params"]:
            raise _fail("the optimizer's param groups hold other parameters than the saved "
                        "ones", "build the optimizer as in the saved run")
