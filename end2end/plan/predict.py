"""A candidate's prediction from the simulator, from reduced-depth copies of the model.

Simulating a paper-scale model at full depth takes minutes per candidate on a laptop, and a
step's time and memory grow linearly with the layers of a pipeline stage (every layer does the
same work; what is not a layer, embeddings, the head, the optimizer over them, is a constant).
So each candidate is simulated with ``K1`` and ``K2`` layers per stage (:data:`DEPTHS`, the same
shape otherwise: :func:`end2end.plan.shapes.with_size`) and every quantity is extrapolated
linearly to the model's ``L`` layers per stage::

    X(L) = X(K1) + (L - K1) x (X(K2) - X(K1)) / (K2 - K1)

for the step time, the per-phase times, the peak memory per rank and what the simulator
judges ``sim-oom`` by. ``K1 = 2`` keeps a checkpoint ratio of 0.5 a whole layer. Models with at
most ``K2`` layers per stage, encoder-decoders and vision models are simulated at full depth.

When it pays: a simulation's cost is mostly fixed (worker processes, imports, building the
runtime; a process per pipeline stage and per micro-batch count), and only a little grows with
the layers: LLaMA-7B at sequence 4096 on 32 H100s simulated in about the same time at 2 and at
32 layers (the ``--check`` lines of ``docs/results/plan/llama-7b_h100-80gb-8x4.txt`` give the
seconds). So two reduced simulations cost more than one full one until a stage holds many
layers, and the planner reduces only above :data:`REDUCE_ABOVE` layers per stage
(``--reduce-above``; 0 reduces every candidate deeper than ``K2``).
The error of the extrapolation against full-depth simulations is checked by
``tests/end2end/plan/test_predict.py`` and reported in docs/planning.md.

Every simulation goes through ``end2end.simulate.engine.run.simulate_run`` (a worker process per
run, what ``python -m end2end.simulate.one`` runs) and is cached on disk, keyed by the run (its
spec's JSON), the profile, the calibration file and a hash of the simulator's, the driver's and
Slapo's sources, so a changed simulator never answers from an old cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from end2end.models import get_model_spec
from end2end.models.flops import train_flops_per_sample
from end2end.plan.cluster import Cluster
from end2end.plan.shapes import with_size
from end2end.plan.ckpt import ckpt_fraction
from end2end.plan.space import Candidate
from end2end.spec.runspec import DTYPES

__all__ = ["DEPTHS", "REDUCE_ABOVE", "Prediction", "reduced_models", "predict",
           "simulate_cached", "sources_hash", "PHASES"]

DEPTHS = (2, 4)  # layers per pipeline stage of the two reduced-depth copies
#: Layers per stage above which the reduced copies are simulated instead of the model (below,
#: one full-depth simulation costs less than two reduced ones: module docstring)
REDUCE_ABOVE = 48
PHASES = ("compute", "recompute", "communication", "bubble")
_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Prediction:
    """What the simulator predicts for a candidate (extrapolated where ``depths`` is set)."""

    status: str
    error: str = ""
    samples_per_s: float = 0.0
    step_time: float = 0.0
    memory_gb: float = 0.0
    """Predicted peak per rank (``PerGPUMem``)."""
    needed_gb: float = 0.0
    """What the simulator compares with the capacity (peak + allocator overhead + reserve)."""
    mfu: float = 0.0
    phases: Dict[str, float] = field(default_factory=dict)
    """Seconds of the step by :data:`PHASES` (the slowest stage's)."""
    depths: Tuple[int, ...] = ()
    """Layers per stage of the simulated copies; ``()``: the full model."""
    seconds: float = 0.0
    """Simulation wall time (0 for cache hits)."""

    @property
    def fits(self) -> bool:
        return self.status == "sim"

    @property
    def dominant(self) -> List[Tuple[str, float]]:
        """The phases by share of the step, largest first."""
        total = sum(self.phases.values()) or 1.0
        return sorted(((k, v / total) for k, v in self.phases.items()), key=lambda kv: -kv[1])


@functools.lru_cache(maxsize=1)
def sources_hash() -> str:
    """A hash of the sources a prediction depends on (simulator, driver, spec, models, slapo)."""
    digest = hashlib.sha256()
    for folder in ("end2end/simulate", "end2end/driver", "end2end/spec", "end2end/models",
                   "slapo"):
        for path in sorted((_ROOT / folder).rglob("*.py")):
            digest.update(str(path.relative_to(_ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def simulate_cached(spec, cluster: Cluster, cache: Optional[Path], timeout: float
                    ) -> Dict[str, Any]:
    """The simulator's row fields for ``spec`` (a RunSpec), from ``cache`` when present; adds
    ``_seconds`` (wall time, 0 when cached)."""
    from end2end.simulate.cost.allocator import allocator_mode
    from end2end.simulate.engine.run import simulate_run

    key_text = json.dumps([json.loads(spec.to_json()) | {"source": ""}, cluster.profile,
                           cluster.calibration, sources_hash(), allocator_mode()],
                          sort_keys=True)
    key = hashlib.sha256(key_text.encode()).hexdigest()
    path = cache / key[:2] / f"{key}.json" if cache else None
    if path is not None and path.is_file():
        return dict(json.loads(path.read_text()), _seconds=0.0)
    began = time.perf_counter()
    values = simulate_run(spec, cluster.profile, cluster.calibration, timeout)
    if path is not None and values.get("status") in ("sim", "sim-oom"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    return dict(values, _seconds=time.perf_counter() - began)


def reduced_models(cand: Candidate, folder: Path, reduce_above: int = REDUCE_ABOVE
                   ) -> List[Tuple[int, str]]:
    """``[(layers per stage, model name)]`` to simulate: the two reduced copies when the
    candidate has more than ``reduce_above`` layers per stage, else the model itself (module
    docstring)."""
    spec = get_model_spec(cand.model)
    per_stage = spec.layers // cand.pp
    if spec.is_encoder_decoder or spec.is_vision or per_stage <= max(DEPTHS[-1], reduce_above):
        return [(per_stage, cand.model)]
    names = [with_size(cand.model, "layers", k * cand.pp, folder) for k in DEPTHS]
    if any(n is None for n in names):
        return [(per_stage, cand.model)]
    return [(k, str(n)) for k, n in zip(DEPTHS, names)]


def _phases(values: Dict[str, Any], ckpt: str) -> Dict[str, float]:
    """Seconds by :data:`PHASES` from a row's ``extra.timing`` (its slowest role);
    ``communication`` is what the collectives add to the step: the exposed ones and the compute
    slowed beside the overlapped ones (``contention``)."""
    timing = values.get("extra", {}).get("timing") or [{}]
    slow = max(timing, key=lambda t: t.get("total", 0.0))
    recompute = ckpt_fraction(ckpt) * slow.get("compute_forward", 0.0)
    return dict(compute=slow.get("compute", 0.0) - recompute, recompute=recompute,
                communication=slow.get("comm_exposed", 0.0) + slow.get("contention", 0.0),
                bubble=max(0.0, float(values.get("step_time") or 0.0) - slow.get("total", 0.0)))


def _numbers(values: Dict[str, Any], ckpt: str) -> Dict[str, float]:
    out = dict(step_time=float(values["step_time"]), memory_gb=float(values["per_gpu_mem"]),
               needed_gb=float(values.get("extra", {}).get("needed_bytes", 0.0)) / 1e9)
    out.update({f"phase_{k}": v for k, v in _phases(values, ckpt).items()})
    return out


def _extrapolate(points: List[Tuple[int, Dict[str, float]]], layers: int) -> Dict[str, float]:
    if len(points) == 1:
        return points[0][1]
    (k1, a), (k2, b) = points
    return {key: a[key] + (layers - k1) * (b[key] - a[key]) / (k2 - k1) for key in a}


def predict(cand: Candidate, runs: List[Tuple[int, Dict[str, Any]]], cluster: Cluster
            ) -> Prediction:
    """The candidate's :class:`Prediction` from its simulated rows ``[(layers per stage,
    row fields)]`` (:func:`reduced_models` order)."""
    seconds = sum(v.get("_seconds", 0.0) for _, v in runs)
    depths = tuple(k for k, _ in runs) if len(runs) > 1 else ()
    for _, values in runs:
        if values.get("status") not in ("sim", "sim-oom"):
            status = values.get("status") or "fail"
            return Prediction("fail" if status == "oom" else status,
                              " ".join(str(values.get("error", "")).split())[:300],
                              depths=depths, seconds=seconds)
    spec = get_model_spec(cand.model)
    x = _extrapolate([(k, _numbers(v, cand.ckpt)) for k, v in runs], spec.layers // cand.pp)
    thrpt = cand.batch / x["step_time"] if x["step_time"] > 0 else 0.0
    peak = cluster.peak_flops[DTYPES[cand.dtype]]
    mfu = thrpt * train_flops_per_sample(cand.model, cand.seq, cand.dec) / cand.n / peak
    fits = x["needed_gb"] * 1e9 <= cluster.memory_bytes
    status, error = ("sim", "") if fits else ("sim-oom", f"predicted {x['needed_gb']:.1f} GB "
                                              f"per rank > {cluster.memory_bytes / 1e9:.1f} GB")
    if fits and cluster.budget_bytes and x["memory_gb"] * 1e9 > cluster.budget_bytes:
        status, error = "sim-oom", (f"predicted {x['memory_gb']:.3g} GB per rank > budget "
                                    f"{cluster.budget_bytes / 1e9:g} GB")
    if mfu > 1:  # faster than the device: the run is not what its layout says
        status, error = "fail", f"predicted MFU {mfu:.0%} is above 100 %: not trusted"
    return Prediction(status, error, thrpt, x["step_time"],
                      x["memory_gb"], x["needed_gb"], mfu,
                      {k: x[f"phase_{k}"] for k in PHASES}, depths, seconds)
