"""The benchmark modes, as one table: every other part of the harness reads a mode from here.

A *mode* is a system the driver can train a model with (a config line's MODE, ``--mode`` of
``python -m end2end.bench``). Its :class:`Mode` entry says everything the harness needs to know
about it: which framework runs it, how the world splits into TP/DP/PP ranks, what it accepts
(a Slapo schedule and its knobs, ``--tp``, ``--pp``, the CKPT values) and what it refuses with
why, how it is drawn and which baseline it is compared with. The driver, the sweep, the plots,
the CLI choices and the docs table of modes (end2end/README.md, checked by a test) all read it;
nothing else tests a mode's name.

Adding a mode is one entry in :data:`MODE_TABLE` and a builder function registered for it in
:mod:`end2end.driver.runtimes` (``@builds("name")``); a test fails when one of them is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from slapo.errors import ConfigError

__all__ = ["Mode", "MODE_TABLE", "MODES", "SLAPO_MODES", "RETIRED_MODES", "get_mode",
           "FIGURE7_GROUPS", "PEER_GROUPS", "modes_markdown"]


@dataclass(frozen=True)
class Mode:
    """One benchmark mode (see the module docstring)."""

    name: str
    """The MODE of a config line and ``--mode`` of the driver."""
    label: str
    """Legend label in figures and column head in tables (``Slapo-TP``)."""
    color: str
    """Bar colour in figures."""
    framework: str
    """What runs the model: ``megatron`` (megatron-core's runtime), ``deepspeed``, ``fsdp``
    (PyTorch FSDP2) or ``torch`` (plain PyTorch, DTensor)."""
    description: str
    """One line for ``--help`` and the docs table."""
    slapo: bool = False
    """Trains the model with its Slapo schedule: accepts ``#@ knobs=``, CKPT is a ratio."""
    tp_default: bool = False
    """Without a ``tp``/``pp`` directive the world is one TP group (TP = n); else data
    parallel (DP = n)."""
    tp: str = "none"
    """Which ``--tp`` it takes without a pipeline: ``any`` (any size dividing n, the rest data
    parallel), ``world`` (only n) or ``none`` (TP 1)."""
    pipeline_target: Optional[str] = None
    """The ``slapo.build`` target that runs its stages for ``--pp`` > 1 (None: no pipelines)."""
    pipeline_refusal: Tuple[str, str] = ("it has no pipeline runtime",
                                         "use mode 'slapo' or 'slapo-deepspeed', or pp=1")
    """(why, hint) of the error for ``--pp`` > 1 when there is no ``pipeline_target``."""
    ckpt: str = "hf"
    """The CKPT grammar: ``ratio`` (a fraction of layers, Slapo modes), ``megatron``
    (0/full/selective) or ``hf`` (HF gradient checkpointing off/on: 0/1)."""
    builds_own_model: bool = False
    """Builds its own model from the HF config (megatron-core's GPT/BERT/T5) instead of
    training the HF model."""
    mixed_precision: bool = False
    """In bf16/fp16 keeps fp32 master weights and fp32 optimizer states (DeepSpeed, FSDP2, the
    megatron modes); the others train the model cast to the dtype, its optimizer states in the
    dtype."""
    master_weights: str = "runtime"
    """Where a ``mixed_precision`` mode keeps its fp32 masters: ``runtime`` (it is given the
    fp32 model and makes the low-precision compute copy itself: DeepSpeed's engine, FSDP2's
    policy) or ``optimizer`` (the model is cast to the dtype and megatron-core's
    ``Float16OptimizerWithFloat16Params`` holds fp32 copies, fp16 with dynamic loss scaling, as
    Megatron-LM: :mod:`end2end.driver.megatron_optimizer`). A mode without
    ``mixed_precision``: ``on_request`` (the cast model with its states in the dtype, unless
    the run asks for ``fp32_masters``: then as ``optimizer``, the way apex's O2 trains the
    plain-PyTorch model) or ``none`` (always the cast model)."""
    schedule_group: str = "world"
    """The TP group of the Slapo schedule: ``world`` (all ranks, or TP blocks of a pipeline),
    ``megatron`` (megatron-core's TP group), ``blocks`` (blocks of ``--tp`` consecutive ranks;
    TP x FSDP) or ``single`` (one-rank groups: ZeRO-3 without TP; a pipeline still gets its TP
    blocks). Baselines: unused."""
    baselines: Tuple[str, ...] = ()
    """The modes a Slapo mode's speedup is taken over, first present first."""
    recipe: Optional[str] = None
    """The ``slapo.model_schedule`` recipe this mode applies to every model (``"auto"``: the
    schedule derived from the HF config's tensor-parallel plan); None: the model's own
    (``ModelSpec.schedule``: its family's hand recipe, or ``"auto"`` where it has none)."""

    @property
    def tp_enabled(self) -> bool:
        """Takes ``--tp`` > 1 without a pipeline."""
        return self.tp != "none"

    def check_fp32_masters(self, pp: int = 1) -> None:
        """Raise :class:`ConfigError` when a run of this mode with ``pp`` stages cannot keep
        the fp32 masters the run option ``fp32_masters`` asks for; the ``mixed_precision``
        modes keep them anyway."""
        if self.mixed_precision or (self.master_weights == "on_request" and pp == 1):
            return
        why = (f"mode {self.name!r} trains the model cast to the dtype" if pp == 1 else
               f"the {self.pipeline_target} pipeline of mode {self.name!r} steps its own "
               "optimizer")
        raise ConfigError(f"fp32_masters: {why}, without master weights",
                          call="fp32_masters", hint="drop the option, or use a mode that keeps "
                          "them: " + ", ".join(m.name for m in MODE_TABLE.values()
                                               if m.master_weights == "on_request"
                                               or m.mixed_precision) + " (pp=1)")

    @property
    def pipeline_enabled(self) -> bool:
        """Takes ``--pp`` > 1."""
        return self.pipeline_target is not None

    def default_parallel_sizes(self, n: int) -> Tuple[int, int, int]:
        """(TP, PP, DP) of a run on ``n`` ranks without a layout directive."""
        return (n, 1, 1) if self.tp_default else (1, 1, n)

    def allows_tp(self, tp: int, pp: int, n: int) -> bool:
        """Whether this mode runs TP ``tp`` with ``pp`` stages on ``n`` ranks: a pipeline
        takes any tp; ``any``: any; ``world``: only tp = n (the schedule shards over every
        rank, so tp=1 on several ranks would run TP = n under a row saying TP 1); ``none``:
        tp = 1."""
        return (pp > 1 or self.tp == "any" or (self.tp == "world" and tp == n)
                or (self.tp == "none" and tp <= 1))

    def check_tp(self, tp: int, pp: int, n: int) -> None:
        """Raise :class:`ConfigError` when this mode cannot run TP ``tp`` (with ``pp`` stages
        on ``n`` ranks): :meth:`allows_tp`."""
        if self.allows_tp(tp, pp, n):
            return
        raise ConfigError(f"tp={tp} is not available in mode {self.name!r} on {n} ranks",
                          call="end2end.bench", hint=_tp_hint())

def _tp_hint() -> str:
    """Which modes take which ``--tp``, from the table."""
    def names(test) -> str:
        return "/".join(f"'{m.name}'" for m in MODE_TABLE.values() if test(m))

    return (f"TP runs under {names(lambda m: m.tp == 'any')} (any tp dividing n), "
            f"{names(lambda m: m.tp == 'world')} (tp = n), or a pipeline (--pp > 1) of "
            f"{names(lambda m: m.pipeline_enabled)} (any tp)")

_PIPELINE_HINT = ("use mode 'slapo' (torch pipeline, TP x DP x PP) or 'slapo-deepspeed' "
                  "(DeepSpeed PipelineModule, TP x DP x PP), or pp=1")

MODE_TABLE: Dict[str, Mode] = {m.name: m for m in (
    Mode("megatron", "Megatron-LM", "#4c72b0", "megatron",
         "megatron-core's own GPT/BERT/T5/LLaMA built from the HF config, TP over all ranks",
         tp_default=True, tp="any", ckpt="megatron", builds_own_model=True,
         mixed_precision=True, master_weights="optimizer",
         pipeline_refusal=("the megatron-core baseline is built without pipeline stages by "
                           "this driver", "use mode 'slapo' (torch pipeline) or "
                           "'slapo-deepspeed' (DeepSpeed pipeline) for pipeline runs; megatron "
                           "runs TP x DP with pp=1")),
    Mode("slapo-megatron", "Slapo-TP", "#dd8452", "megatron",
         "the HF model with its Slapo TP schedule under megatron-core's runtime",
         slapo=True, tp_default=True, tp="any", ckpt="ratio", schedule_group="megatron",
         mixed_precision=True, master_weights="optimizer",
         baselines=("megatron", "dtensor-tp"),
         pipeline_refusal=("the megatron dialect does not build schedules with pipeline cuts",
                           _PIPELINE_HINT)),
    Mode("deepspeed", "DeepSpeed", "#55a868", "deepspeed",
         "the unscheduled HF model under DeepSpeed ZeRO-3", mixed_precision=True,
         pipeline_refusal=("the ZeRO-3 baseline runs the unscheduled model (no stage cuts), "
                           "and ZeRO-3 does not combine with DeepSpeed pipelines",
                           "use mode 'slapo-deepspeed' (a DeepSpeed PipelineModule of the "
                           "scheduled model's stages), or pp=1")),
    Mode("slapo-deepspeed", "Slapo-ZeRO3", "#c44e52", "deepspeed",
         "the scheduled HF model under ZeRO-3 (no TP); with --pp a DeepSpeed pipeline (TP x PP)",
         slapo=True, ckpt="ratio", mixed_precision=True, schedule_group="single",
         pipeline_target="deepspeed", baselines=("deepspeed",)),
    Mode("eager", "Eager", "#8172b3", "torch",
         "the unscheduled HF model on plain PyTorch (DDP on several ranks)",
         master_weights="on_request",
         pipeline_refusal=("the unscheduled HF model has no stage cuts",
                           "use mode 'slapo' (the same model cut into stages by its Slapo "
                           "schedule, on plain PyTorch), or pp=1")),
    Mode("slapo", "Slapo", "#937860", "torch",
         "the scheduled model on plain PyTorch, TP over all ranks; with --pp a torch pipeline",
         slapo=True, tp_default=True, tp="world", ckpt="ratio", pipeline_target="torch",
         master_weights="on_request", baselines=("eager",)),
    Mode("fsdp", "FSDP2", "#8c8c8c", "fsdp",
         "the unscheduled HF model under FSDP2 (fully_shard per layer + root)",
         mixed_precision=True),
    Mode("slapo-fsdp", "Slapo-FSDP2", "#da8bc3", "fsdp",
         "the scheduled model under the same FSDP2 wrapping; --tp T: TP x FSDP",
         slapo=True, tp="any", ckpt="ratio", mixed_precision=True, schedule_group="blocks",
         baselines=("fsdp",)),
    Mode("dtensor-tp", "DTensor-TP", "#64b5cd", "torch",
         "the unscheduled HF model with PyTorch's DTensor TP plan of its family",
         tp_default=True, tp="world", master_weights="none"),
    Mode("hf-tp", "HF-TP", "#e5ae38", "torch",
         "the unscheduled HF model sharded by transformers' own tensor parallelism "
         "(apply_tensor_parallelism) with its config's plan, TP over all ranks",
         tp_default=True, tp="world", master_weights="none"),
    Mode("slapo-auto", "Slapo-auto", "#2ca02c", "torch",
         "the model with the Slapo schedule derived from its config's TP plan (\"auto\") on "
         "plain PyTorch, TP over all ranks", slapo=True, tp_default=True, tp="world",
         ckpt="ratio", recipe="auto", baselines=("hf-tp", "fsdp", "dtensor-tp"),
         master_weights="on_request",
         pipeline_refusal=("the 'auto' mode runs without pipeline stages",
                           "use mode 'slapo' (its torch pipeline runs the model's own recipe, "
                           "'auto' for the families without a hand recipe), or pp=1")),
)}

MODES: Tuple[str, ...] = tuple(MODE_TABLE)
SLAPO_MODES: Tuple[str, ...] = tuple(m.name for m in MODE_TABLE.values() if m.slapo)
# Names of the artifact that are no longer modes: the error says why and what to do instead.
RETIRED_MODES = {"torchscript": "TorchScript is deprecated in PyTorch 2.x and not supported; "
                                "use 'eager' or 'slapo' (comment the line out with #)"}
# The figures' panels: a group is shown when a model has a row of any of its members.
FIGURE7_GROUPS = (("megatron", "slapo-megatron", "deepspeed", "slapo-deepspeed"),
                  ("eager", "slapo"))
PEER_GROUPS = (("fsdp", "slapo-fsdp", "dtensor-tp", "slapo-megatron"),)


def get_mode(name: str) -> Mode:
    """The :class:`Mode` called ``name``; :class:`ConfigError` naming the modes otherwise."""
    try:
        return MODE_TABLE[name]
    except KeyError:
        hint = RETIRED_MODES.get(name, f"use one of {', '.join(MODES)}")
        raise ConfigError(f"unknown mode {name!r}", hint=hint) from None


def modes_markdown() -> str:
    """The docs table of modes (end2end/README.md holds exactly this; a test compares)."""
    lines = ["| Mode | Label | Runs on | Default layout | `--tp` | `--pp` | CKPT | Compared with |"
             " What it is |", "|---|---|---|---|---|---|---|---|---|"]
    tp_text = {"any": "any dividing n", "world": "n only", "none": "-"}
    ckpt_text = {"ratio": "ratio in [0, 1] or op", "megatron": "0/full/selective", "hf": "0/1"}
    for m in MODE_TABLE.values():
        layout = "TP = n" if m.tp_default else "DP = n"
        pp = f"yes ({m.pipeline_target})" if m.pipeline_enabled else "-"
        vs = ", ".join(f"`{b}`" for b in m.baselines) or "-"
        lines.append(f"| `{m.name}` | {m.label} | {m.framework} | {layout} | {tp_text[m.tp]} | "
                     f"{pp} | {ckpt_text[m.ckpt]} | {vs} | {m.description} |")
    return "\n".join(lines) + "\n"
