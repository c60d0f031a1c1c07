"""The candidate space: every (mode, TP, PP, DP, micro-batch, CKPT) the driver can run for a
model on a cluster, each a valid config line, and the rules that prune it before simulation.

For each mode of :data:`PLANNED_MODES` (the Slapo modes and their baselines, the table of
modes :mod:`end2end.spec.modes` says what each accepts):

* TP: the divisors of the world that the mode takes (``Mode.tp``: any, the whole world only,
  or none; a pipeline takes any), at most the GPUs of one node;
* PP: 1, or the divisors of the world for the modes with a pipeline runtime;
* DP = world / (TP x PP), which must divide the global batch;
* the micro-batch: powers of two up to :data:`MAX_MICRO` dividing the replica's batch (a
  pipeline's micro-batches, or gradient accumulation, which every mode runs), and without a
  pipeline outside the megatron modes the whole replica's batch too (no accumulation); the
  global batch = DP x micro x accumulation;
* CKPT: ``0, 0.5, op, 1`` (Slapo modes' ratio, and ``op``: every layer checkpointed
  selectively; not on vision models), ``0, selective, full`` (megatron), ``0, 1`` (HF gradient
  checkpointing) (:mod:`end2end.plan.ckpt`);
* the recipe's knobs (:func:`knob_choices`): ``sequence_parallel=True`` and the default, for
  a Slapo mode with TP > 1 (with or without a pipeline) whose recipe declares sequence parallelism
  (:func:`slapo.model_schedule.supports_sequence_parallel`). The other knobs keep the
  recipe's defaults, which are its fast choices (fused kernels, flash attention).

Each point is checked by :mod:`end2end.plan.rules` (divisibility, memory lower bound) and then
by the driver's own checks (``make_run_spec``, ``run_layout``): :func:`enumerate_space` returns
the survivors and how many each rule pruned.
"""

from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from slapo.errors import SlapoError

from end2end.models import ModelSpec, get_model_spec
from end2end.plan.ckpt import checkpointed_share, ckpt_choices
from end2end.plan.cluster import Cluster
from end2end.plan.limits import NO_LIMITS, SpaceLimits
from end2end.plan.rules import divisibility_problem, memory_lower_bound, mode_problem
from end2end.spec.modes import get_mode

__all__ = ["PLANNED_MODES", "Candidate", "Space", "enumerate_space", "knob_choices"]

#: The modes the planner searches: the Slapo modes first, then their baselines.
PLANNED_MODES = ("slapo", "slapo-megatron", "slapo-deepspeed", "slapo-fsdp",
                 "megatron", "deepspeed", "fsdp", "eager")
MAX_MICRO = 16  # the largest micro-batch tried (a power of two)


@dataclass(frozen=True)
class Candidate:
    """One point of the space: a config line at one world size."""

    mode: str
    model: str
    n: int
    seq: int
    dec: int
    batch: int
    ckpt: str
    dtype: str
    tp: int
    pp: int
    micro: int
    knobs: str = ""  # the recipe's knobs, canonical text (end2end.spec.knobs.format_knobs)

    @property
    def dp(self) -> int:
        return self.n // (self.tp * self.pp)

    @property
    def accumulation(self) -> int:
        """Micro-batches per replica and step (gradient accumulation / pipeline depth)."""
        return self.batch // (self.dp * self.micro)

    @property
    def is_slapo(self) -> bool:
        return get_mode(self.mode).slapo

    @property
    def gives_micro(self) -> bool:
        """Whether the line names its micro-batch: the megatron modes and pipelines always,
        the other modes when they accumulate gradients (their default is the replica's whole
        batch)."""
        return get_mode(self.mode).framework == "megatron" or self.pp > 1 or self.accumulation > 1

    @property
    def pragma(self) -> str:
        """The ``#@`` line of the run's options."""
        text = f"#@ dtype={self.dtype} tp={self.tp} pp={self.pp}"
        text += f" micro_batch={self.micro}" if self.gives_micro else ""
        return text + (f" knobs={self.knobs}" if self.knobs else "")  # knobs= takes the rest

    @property
    def sequence_parallel(self) -> bool:
        return "sequence_parallel=True" in self.knobs.split(",")

    @property
    def config_line(self) -> str:
        """``MODE MODEL GPUS SEQ DEC BATCH CKPT`` (shell-quoted as the grammar reads it)."""
        return shlex.join([self.mode, self.model, str(self.n), str(self.seq), str(self.dec),
                           str(self.batch), self.ckpt])

    @property
    def line(self) -> str:
        """The pragma and the config line: a config file of one run."""
        return f"{self.pragma}\n{self.config_line}"

    @property
    def label(self) -> str:
        """A short name: ``slapo-megatron tp8 pp1 dp4 mb2 ckpt=0.5`` (`` [knobs]`` after)."""
        return (f"{self.mode} tp{self.tp} pp{self.pp} dp{self.dp} mb{self.micro} "
                f"ckpt={self.ckpt}" + (f" [{self.knobs}]" if self.knobs else ""))

    def run_spec(self, model: str = ""):
        """The driver's validated :class:`RunSpec` (``model``: another name, e.g. the
        reduced-depth copy); ``ConfigError`` where the driver refuses it."""
        from end2end.spec.config_file import make_run_spec
        from end2end.spec.layout import run_layout

        spec = make_run_spec(self.mode, model or self.model, self.n, self.seq, self.dec,
                             self.batch, self.ckpt, source="end2end.plan", dtype=self.dtype,
                             tp=self.tp, pp=self.pp,
                             micro_batch=self.micro if self.gives_micro else None,
                             knobs=self.knobs or None)
        run_layout(spec)
        return spec


@dataclass
class Space:
    """The survivors of the rules and how many points each rule pruned."""

    candidates: List[Candidate]
    pruned: Counter = field(default_factory=Counter)
    examples: Dict[str, str] = field(default_factory=dict)  # rule -> one pruned point's reason

    @property
    def total(self) -> int:
        return len(self.candidates) + sum(self.pruned.values())


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _layouts(mode: str, n: int) -> List[Tuple[int, int]]:
    """(TP, PP) pairs the mode's table entry allows on ``n`` ranks."""
    info = get_mode(mode)
    pps = _divisors(n) if info.pipeline_enabled else [1]
    pairs = []
    for pp in pps:
        for tp in _divisors(n // pp):
            if info.allows_tp(tp, pp, n):
                pairs.append((tp, pp))
    return pairs


def _micros(mode: str, pp: int, local: int) -> List[int]:
    out, m = [], 1
    while m <= min(local, MAX_MICRO):
        if local % m == 0:
            out.append(m)
        m *= 2
    if get_mode(mode).framework != "megatron" and pp == 1 and local not in out:
        out.append(local)  # the mode's default: no accumulation
    return out


def knob_choices(spec: ModelSpec, mode: str, tp: int) -> Tuple[str, ...]:
    """The recipe-knob texts searched for one (mode, TP) (module docstring): sequence
    parallelism first (it holds a TP-th of the activations the default holds between the TP
    regions, for the same communication volume: Korthikanti et al. 2022, §4.2.2), then the
    default. Pipelines take it too (tests/pipeline/test_tp_pipeline.py trains TP 2 x PP 2
    with it on both pipeline runtimes)."""
    from slapo.model_schedule import supports_sequence_parallel

    if get_mode(mode).slapo and tp > 1 and spec.schedule != "auto" \
            and supports_sequence_parallel(spec.schedule):
        return ("sequence_parallel=True", "")
    return ("",)


def _prune(space: Space, rule: str, reason: str, count: int = 1) -> None:
    space.pruned[rule] += count
    space.examples.setdefault(rule, reason)


def _add_layout(space: Space, spec: ModelSpec, cluster: Cluster, base: dict,
                limits: SpaceLimits = NO_LIMITS) -> None:
    """The micro-batch, CKPT and knob points of one (mode, TP, PP), memory-checked."""
    mode, tp, pp = base["mode"], base["tp"], base["pp"]
    dp = cluster.gpus // (tp * pp)
    ckpts = limits.ckpts(mode, ckpt_choices(mode, spec.is_vision), spec.is_vision)
    if base["batch"] % dp:
        _prune(space, "batch", f"global batch {base['batch']} not divisible by dp {dp}",
               len(ckpts))
        return
    local = base["batch"] // dp
    points = [(micro, ckpt, knobs)
              for micro in limits.micros(_micros(mode, pp, local), local)
              for ckpt in ckpts
              for knobs in limits.knob_texts(knob_choices(spec, mode, tp))]
    for micro, ckpt, knobs in points:
        cand = Candidate(ckpt=ckpt, micro=micro, n=cluster.gpus, knobs=knobs, **base)
        need = memory_lower_bound(spec, mode, cand.dtype, tp, pp, dp, micro, cand.seq,
                                  checkpointed_share(ckpt), cand.sequence_parallel)
        need = need * (1 + cluster.allocator_overhead) + cluster.reserved_bytes
        if need > cluster.capacity_bytes:
            _prune(space, "memory", f"{cand.label}: at least {need / 1e9:.1f} GB per rank "
                   f"> {cluster.capacity_bytes / 1e9:.1f} GB")
            continue
        try:
            cand.run_spec()
        except SlapoError as exc:
            _prune(space, "driver", f"{cand.label}: {' '.join(str(exc).split())}")
            continue
        space.candidates.append(cand)


def enumerate_space(model: str, cluster: Cluster, seq: int, batch: int, dtype: str,
                    dec: int = 0, modes: Tuple[str, ...] = PLANNED_MODES,
                    limits: SpaceLimits = NO_LIMITS) -> Space:
    """Every candidate of ``model`` on ``cluster`` (module docstring) and the pruned counts;
    ``limits``: the CKPT values, TP, PP and accumulation steps searched, where given
    (:mod:`end2end.plan.limits`)."""
    spec = get_model_spec(model)
    space = Space([])
    for mode in modes:
        why = mode_problem(spec, mode)
        if why:
            _prune(space, "mode", f"{mode}: {why}")
            continue
        for tp, pp in _layouts(mode, cluster.gpus):
            if not limits.allows_layout(tp, pp):
                continue
            problem = divisibility_problem(spec, tp, pp, cluster.gpus_per_node)
            if problem:
                _prune(space, "divisibility", f"{mode} tp{tp} pp{pp}: {problem}",
                       len(ckpt_choices(mode, spec.is_vision)))
                continue
            base = dict(mode=mode, model=model, seq=seq, dec=dec, batch=batch, dtype=dtype,
                        tp=tp, pp=pp)
            _add_layout(space, spec, cluster, base, limits)
    return space
