"""Measure what DeepSpeed ZeRO-3 costs per step beyond the ops the simulator records.

The simulator runs a ``deepspeed``/``slapo-deepspeed`` line as the same model on plain PyTorch
and adds ZeRO-3 by a model (:mod:`end2end.simulate.engine.modelled`): states, working set,
collectives.
A real ZeRO-3 step also runs DeepSpeed's Python per module (pre/post forward and backward hooks:
fetch, gather, release, the trace of the prefetch coordinator), per parameter (the gradient
hook that copies each gradient into the reduce bucket, partition bookkeeping) and per byte
(flattening gradients into buckets, copying gathered and reduced partitions, ``cat``/``copy_``),
none of which is an op of the plain-PyTorch step. This module measures those costs on this
machine, with a real DeepSpeed ZeRO-3 engine on 2 gloo ranks of one thread each (as the sweep
runs the deepspeed lines: ``torchrun`` sets ``OMP_NUM_THREADS=1``), the driver's DeepSpeed
config (:func:`end2end.driver.runtimes.default_deepspeed_config`) and AdamW.

Three models, each trained for a few steps both under the engine and on plain PyTorch (the
simulator's stand-in) in the same processes; per phase (forward, backward, optimizer) the
difference of the median step times is DeepSpeed's extra:

* ``modules``: 64 ``Linear(8, 8)`` without bias (65 hooked modules, 64 tiny parameters:
  below ``stage3_param_persistence_threshold``, kept whole);
* ``params``: 64 modules of 4 tiny parameters each (65 modules, 256 parameters);
* ``bytes``: 4 ``Linear(2048, 2048)`` without bias (5 modules, 4 partitioned parameters,
  67 MB: the size of the CPU configs' models), less ZeRO-3's collectives as the time model
  charges them (the gloo bandwidths measured beside, so they are not counted twice).

Solved per phase: seconds per hooked module, per parameter and per parameter byte
(:data:`KEYS`), each at least 0. Applied by :func:`end2end.simulate.engine.modelled.zero3_costs`
from
the rank's counts. The optimizer step of ZeRO-3 runs on the rank's partition only; what that
saves against the full AdamW step the simulator records is not credited (clamped at 0).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

__all__ = ["measure_zero3", "KEYS", "solve", "PHASES"]

PHASES = ("forward", "backward", "optimizer")
KEYS = tuple(f"zero3.{what}.{phase}" for what in ("module", "param", "byte") for phase in PHASES)
STEPS = 6  # timed steps per model and runtime (after two warm-up steps)


class _FourParams(nn.Module):
    """A module of four tiny parameters: ``(x @ w1 + b1) @ w2 + b2``."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.w1, self.w2 = (nn.Parameter(torch.randn(width, width) / width) for _ in range(2))
        self.b1, self.b2 = (nn.Parameter(torch.zeros(width)) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.w1 + self.b1) @ self.w2 + self.b2


def _models() -> Dict[str, Tuple[Callable[[], nn.Module], int]]:
    """name -> (builder, input width)."""
    return dict(modules=(lambda: nn.Sequential(*[nn.Linear(8, 8, bias=False)
                                                 for _ in range(64)]), 8),
                params=(lambda: nn.Sequential(*[_FourParams() for _ in range(64)]), 8),
                bytes=(lambda: nn.Sequential(*[nn.Linear(2048, 2048, bias=False)
                                               for _ in range(4)]), 2048))


def counts(model: nn.Module, threshold: int = 100_000) -> Dict[str, int]:
    """What ZeRO-3's per-step cost scales with: hooked modules (every module), parameters,
    parameter bytes, and the partitioned parameters (more than ``threshold`` elements:
    DeepSpeed's ``stage3_param_persistence_threshold``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return dict(module=sum(1 for _ in model.modules()), param=len(params),
                byte=sum(p.numel() * p.element_size() for p in params),
                partitioned=sum(1 for p in params if p.numel() > threshold))


def _phase_times(forward, backward, step, steps: int) -> Dict[str, float]:
    """Median seconds per phase over ``steps`` steps (two untimed first)."""
    import torch.distributed as dist

    times: Dict[str, List[float]] = {p: [] for p in PHASES}
    for i in range(steps + 2):
        dist.barrier()
        t0 = time.perf_counter()
        loss = forward()
        t1 = time.perf_counter()
        backward(loss)
        t2 = time.perf_counter()
        step()
        t3 = time.perf_counter()
        if i >= 2:
            for phase, t in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2)):
                times[phase].append(t)
    return {p: statistics.median(v) for p, v in times.items()}


def _one_model(build: Callable[[], nn.Module], width: int, steps: int) -> Dict[str, float]:
    """(DeepSpeed ZeRO-3 - plain PyTorch) seconds per phase of one model, on this rank."""
    import copy

    import slapo
    from end2end.driver.runtimes import default_deepspeed_config, default_optimizer

    torch.manual_seed(0)
    model = build()
    reference = copy.deepcopy(model)
    x = torch.randn(4, width)
    opt = default_optimizer(reference.parameters())

    def torch_step():
        opt.step()
        opt.zero_grad(set_to_none=True)

    plain = _phase_times(lambda: reference(x).square().mean(), lambda loss: loss.backward(),
                         torch_step, steps)
    engine, _ = slapo.build(slapo.create_schedule(model), target="deepspeed",
                            optimizer=default_optimizer, config=default_deepspeed_config())
    zero3 = _phase_times(lambda: engine(x).square().mean(), engine.backward, engine.step, steps)
    return {p: zero3[p] - plain[p] for p in PHASES}


def _worker(steps: int) -> Dict[str, Dict[str, float]]:
    torch.set_num_threads(1)  # as each rank of a 2-rank sweep line (OMP_NUM_THREADS=1)
    return {name: _one_model(build, width, steps) for name, (build, width) in _models().items()}


def solve(extra: Dict[str, Dict[str, float]], comm: Dict[str, float]) -> Dict[str, float]:
    """Seconds per module, parameter and byte per phase (:data:`KEYS`) from the three models'
    extra seconds per phase (``extra[model][phase]``), less the collectives' seconds the time
    model charges the ``bytes`` model per phase (``comm``): per phase the 3 x 3 system
    ``modules x a + params x b + bytes x c = extra``, each cost at least 0 (noise)."""
    names = ("modules", "params", "bytes")
    n = {name: counts(build()) for name, (build, _) in _models().items()}
    what = ("module", "param", "byte")
    matrix = torch.tensor([[float(n[name][w]) for w in what] for name in names],
                          dtype=torch.float64)
    out: Dict[str, float] = {}
    for phase in PHASES:
        rhs = torch.tensor([extra[name][phase] - (comm.get(phase, 0.0) if name == "bytes"
                                                  else 0.0) for name in names],
                           dtype=torch.float64)
        for w, cost in zip(what, torch.linalg.solve(matrix, rhs).tolist()):
            out[f"zero3.{w}.{phase}"] = max(cost, 0.0)
    return out


def bytes_model_comm(profile_comm: Dict[str, float]) -> Dict[str, float]:
    """Seconds per phase of ZeRO-3's collectives on the ``bytes`` model as the time model
    charges them (``profile_comm``: ``alpha_s`` and ``collective_bandwidth`` of the
    calibration)."""
    from end2end.simulate.cost.timing import ring_factor, ring_steps
    from end2end.simulate.engine.modelled import module_gathers, zero3_collectives

    model = _models()["bytes"][0]()
    params = counts(model)["byte"] // 4
    gathered, _ = module_gathers(model)
    out: Dict[str, float] = {}
    bandwidth = profile_comm["collective_bandwidth"]
    for c in zero3_collectives(gathered, params, (0, 1), False, False):
        bw = bandwidth.get(c.kind, bandwidth["allreduce"])
        t = ring_steps(c.kind, 2) * profile_comm["alpha_s"] + ring_factor(c.kind, 2) * c.bytes / bw
        out[c.phase] = out.get(c.phase, 0.0) + t
    return out


def measure_zero3(profile_comm: Dict[str, float], steps: int = STEPS) -> Dict[str, float]:
    """ZeRO-3's extra seconds per module, parameter and byte per phase (module docstring),
    measured on 2 gloo ranks (rank 0's; ``profile_comm``: see :func:`bytes_model_comm`)."""
    from end2end.simulate.calibration.local_ranks import on_local_ranks

    extra = on_local_ranks(_worker, 2, steps, timeout=600, threads=1)[0]
    return solve(extra, bytes_model_comm(profile_comm))
