"""The time model: a simulated rank's recorded work on a :class:`DeviceProfile`.

* Each kernel on a GPU profile: the roofline of :mod:`end2end.simulate.cost.gpu_model` (GEMM
  efficiency by shape: tile and wave quantisation; fused attention at its kernel's efficiency;
  a phase no faster than the host issues its kernels; views cost nothing).
* Each op on the ``cpu`` profile: the eager-PyTorch model of :mod:`end2end.simulate.cost.cpu_model`
  (``max(flops / rate(kind, flops), bytes / bandwidth(op, bytes)) + per-op cost``, views their
  own measured cost), with the threads a rank has: all cores for a 1-rank run, one per rank
  when several ranks share the machine (``ranks_on_node``; torchrun's ``OMP_NUM_THREADS=1``).
* Each collective: ring alpha-beta, ``base + steps x alpha + factor x bytes / bandwidth``
  (NCCL's latency model: a fixed ``collective_base_s`` per call, ``inter_alpha_s`` for the
  ring's steps that cross nodes - ``nodes - 1`` of its ``g - 1`` per pass - and ``alpha_s``
  for the others), factor
  ``2 (g-1)/g`` for an all-reduce, ``(g-1)/g`` for an all-gather / reduce-scatter / all-to-all
  (of the whole tensor), 1 for a point-to-point send or a broadcast. The bandwidth
  (:func:`ring_bandwidth`): a group inside one node runs on NVLink (per GPU, one direction). A
  group across nodes runs NCCL's rings through the nodes' NICs: with ``r`` of its ranks on a
  node (the fewest on any of its nodes), the node's ``gpus_per_node / r`` groups of the same
  shape (every rank of the node is in one, and they communicate at once, SPMD) share the
  node's network, so each gets ``inter_node_bandwidth x r / gpus_per_node``: a ZeRO-3/FSDP or
  DDP group over every rank (``r`` = 8) has the whole node's network, the data-parallel groups
  of TP 8 x DP (``r`` = 1) an eighth each, as does a pipeline's point-to-point pair. The ring's
  rate is the slower of that times ``network_efficiency`` and NVLink times ``link_efficiency``
  (:func:`ring_rate`).
* Overlap, as each runtime does it (:data:`OVERLAPPED`): DDP's gradient all-reduce runs during
  the backward, ZeRO-3's and FSDP2's all-gathers and reduce-scatters during the forward/backward
  they prefetch for; tensor-parallel collectives are on the critical path. An overlapped
  collective costs what exceeds its phase's compute, and on a GPU profile the compute beside it
  is slowed by the profile's ``overlap_slowdown`` (:func:`overlap_cost`; the step's
  ``contention``). On ``cpu`` nothing overlaps when the ranks' threads take every core (gloo
  computes on the same cores), and each collective kind has its measured bandwidth (gloo's
  all-gather and reduce-scatter are slower than its all-reduce).
* Pipelines: the slowest stage's step plus the bubble, ``(P - 1)`` of its micro-batch times.
"""

from __future__ import annotations

from typing import Dict, Iterable, Set, Tuple

from end2end.simulate.cost.gpu_model import phase_seconds
from end2end.simulate.cost.profiles import DeviceProfile
from end2end.simulate.cost.records import CollectiveRecord, OpRecord

__all__ = ["OVERLAPPED", "overlapped_kinds", "compute_seconds", "collective_seconds",
           "rank_seconds", "overlap_cost", "step_seconds", "ring_factor", "ring_steps",
           "ring_bandwidth", "ring_rate", "ranks_per_node"]

# (framework, slapo?) -> collective kinds the runtime overlaps with compute
OVERLAPPED: Dict[Tuple[str, bool], Set[str]] = {
    ("torch", False): {"allreduce"},  # DDP buckets during the backward
    ("deepspeed", False): {"allgather", "reducescatter"},
    ("deepspeed", True): {"allgather", "reducescatter"},
    ("fsdp", False): {"allgather", "reducescatter"},
    ("fsdp", True): {"allgather", "reducescatter"},
}


def overlapped_kinds(framework: str, slapo: bool) -> Set[str]:
    """Collective kinds the runtime of a mode overlaps with compute (``OVERLAPPED``)."""
    return OVERLAPPED.get((framework, slapo), set())


def compute_seconds(ops: Iterable[OpRecord], profile: DeviceProfile, ranks_on_node: int = 1
                    ) -> Dict[str, float]:
    """Seconds per phase: the GPU model on GPU profiles, the eager model on ``cpu`` (module
    docstring; ``ranks_on_node``: ranks of the run sharing this rank's machine)."""
    if profile.eager is None:
        return phase_seconds(ops, profile)
    out: Dict[str, float] = {}
    model = profile.eager.for_ranks(ranks_on_node, profile.memory_bandwidth)
    for op in ops:
        out[op.phase] = out.get(op.phase, 0.0) + model.op_time(op) * op.weight
    return out


def ranks_per_node(ranks: Tuple[int, ...], per_node: int) -> Dict[int, int]:
    """The group's ranks on each node it spans (node index -> count)."""
    out: Dict[int, int] = {}
    for r in ranks:
        out[r // per_node] = out.get(r // per_node, 0) + 1
    return out


def ring_bandwidth(ranks: Tuple[int, ...], profile: DeviceProfile) -> float:
    """Bytes/s of one rank's ring traffic for a group of ``ranks`` (module docstring), before
    ``link_efficiency``."""
    nodes = ranks_per_node(ranks, profile.gpus_per_node)
    if len(nodes) <= 1:
        return profile.intra_node_bandwidth
    share = min(nodes.values()) / profile.gpus_per_node
    return min(profile.inter_node_bandwidth * share, profile.intra_node_bandwidth)


def ring_rate(ranks: Tuple[int, ...], profile: DeviceProfile) -> float:
    """:func:`ring_bandwidth` at what the links reach: NVLink's at ``link_efficiency``, the
    network's share at ``network_efficiency`` (module docstring)."""
    nvlink = profile.intra_node_bandwidth * profile.link_efficiency
    nodes = ranks_per_node(ranks, profile.gpus_per_node)
    if len(nodes) <= 1:
        return nvlink
    share = min(nodes.values()) / profile.gpus_per_node
    return min(profile.inter_node_bandwidth * share * profile.network_efficiency, nvlink)


def ring_factor(kind: str, g: int) -> float:
    """The share of a collective's bytes each rank sends on a ring of ``g`` (module docstring)."""
    return {"allreduce": 2 * (g - 1) / g, "p2p": 1.0, "broadcast": 1.0}.get(kind, (g - 1) / g)


def ring_steps(kind: str, g: int) -> int:
    """The latency-bound steps of a collective on a ring of ``g``."""
    return 2 * (g - 1) if kind == "allreduce" else (1 if kind == "p2p" else g - 1)


def collective_seconds(c: CollectiveRecord, profile: DeviceProfile) -> float:
    """Alpha-beta seconds of one collective (see the module docstring; on ``cpu`` the bandwidth
    measured for its kind where there is one)."""
    g = max(c.group_size, 1)
    if g == 1 or c.kind == "barrier":
        return 0.0
    ranks = c.ranks or tuple(range(g))
    nodes = len(ranks_per_node(ranks, profile.gpus_per_node))
    bw = ring_rate(ranks, profile)
    if profile.eager is not None:
        bw = profile.eager.collective_bandwidth.get(c.kind, bw)
    steps = ring_steps(c.kind, g)
    # NCCL's ring latency: the steps that cross a node boundary at the network's latency
    crossing = min(steps, (nodes - 1) * steps // max(g - 1, 1)) if nodes > 1 else 0
    latency = profile.collective_base_s + crossing * profile.inter_alpha_s \
        + (steps - crossing) * profile.alpha_s
    return latency + ring_factor(c.kind, g) * c.bytes / bw


def rank_seconds(ops, collectives, profile: DeviceProfile, overlapped: Set[str],
                 ranks_on_node: int = 1) -> Dict[str, float]:
    """One rank's step: compute per phase, exposed and hidden communication, total
    (``ranks_on_node``: see :func:`compute_seconds`)."""
    compute = compute_seconds(ops, profile, ranks_on_node)
    if profile.eager is not None and not profile.eager.overlaps(ranks_on_node):
        overlapped = set()  # no core to spare for gloo: communication and compute take turns
    exposed, hidden = 0.0, 0.0
    per_phase: Dict[str, float] = {}
    for c in collectives:
        t = collective_seconds(c, profile) * c.weight
        if c.kind in overlapped and not c.exposed:
            per_phase[c.phase] = per_phase.get(c.phase, 0.0) + t
        else:
            exposed += t
    contention = 0.0
    for phase, t in per_phase.items():
        over = max(0.0, t - compute.get(phase, 0.0))
        exposed += over
        hidden += t - over
        contention += overlap_cost(t, compute.get(phase, 0.0), profile.overlap_slowdown) - over
    total = sum(compute.values()) + exposed + contention
    return dict(compute=sum(compute.values()), comm_exposed=exposed, comm_hidden=hidden,
                contention=contention, total=total,
                **{f"compute_{k}": v for k, v in compute.items()})


def overlap_cost(comm: float, compute: float, slowdown: float) -> float:
    """What ``comm`` seconds of collectives overlapped with a phase's ``compute`` seconds add
    to the phase: compute beside a collective progresses at ``1 / (1 + slowdown)`` of its rate
    (``overlap_slowdown``), so the phase takes ``compute + comm x slowdown / (1 + slowdown)``
    while the collectives end first, and ``comm`` once they outlast the slowed compute."""
    return max(comm - compute, comm * slowdown / (1 + slowdown))


def step_seconds(rank_totals: Iterable[float], pp: int, microbatches: int) -> float:
    """The step: the slowest simulated rank, plus the pipeline bubble when ``pp`` > 1."""
    slowest = max(rank_totals)
    if pp > 1:
        slowest += (pp - 1) * slowest / max(microbatches, 1)
    return slowest
