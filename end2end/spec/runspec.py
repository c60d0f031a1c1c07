"""The typed runs a benchmark config expands to, and their identity in results files.

:class:`ConfigLine` is one parsed config line, :class:`RunSpec` one run of it at one rank count;
:func:`run_key` identifies a run in a results file and :func:`default_parallel_sizes` gives the
artifact's (TP, PP, DP) layout of a mode (from the table of modes, :mod:`end2end.spec.modes`).
Parsing lives in :mod:`end2end.spec.config_file`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple, Union

from end2end.spec.modes import MODES, SLAPO_MODES, Mode, get_mode

__all__ = ["MODES", "SLAPO_MODES", "ConfigLine", "RunSpec", "format_ratio", "run_key",
           "default_parallel_sizes", "DTYPES", "SELECTIVE_CKPT"]

#: The run dtypes of configs and the command line, and their torch names (the one table).
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}

#: CKPT words of the ratio modes that checkpoint every layer selectively, and the Slapo
#: checkpoint policy each stands for (``slapo.runtime.checkpoint_policy.POLICIES``): ``op`` is
#: torchtitan's selective "op" activation checkpointing (every second matmul's output and the
#: attention kernels' outputs kept, everything else recomputed).
SELECTIVE_CKPT = {"op": "save_every_other_matmul"}


def format_ratio(ratio: float) -> str:
    """Canonical text of a checkpoint ratio: ``0``, ``0.25``, ``1`` (used in keys and rows)."""
    return f"{float(ratio):g}"


def default_parallel_sizes(mode: str, n: int) -> Tuple[int, int, int]:
    """(TP, PP, DP) of a run without a layout directive, as in the artifact: Megatron modes,
    ``slapo`` and ``dtensor-tp`` shard over all ranks (TP = n); DeepSpeed modes (ZeRO-3), the
    FSDP2 modes and ``eager`` are data parallel (DP = n) (:attr:`Mode.tp_default`)."""
    return get_mode(mode).default_parallel_sizes(n)


def run_key(mode: str, model: str, seq_len: int, dec_seq_len: int, n: int, batch_size: int,
            ckpt: str, tp: Optional[int] = None, pp: Optional[int] = None, knobs: str = "",
            repeat: int = 0) -> Tuple:
    """The identity of a run, in results-column order (Impl Model Seq DecSeq nGPU Batch Ckpt),
    then its layout: ``""`` for the mode's default (:func:`default_parallel_sizes`; also when
    ``tp``/``pp`` are unknown), else ``"tp<T>.pp<P>"``, so a pipelined and a default run of
    the same line are two runs; then the schedule knobs (canonical text,
    :func:`end2end.spec.knobs.format_knobs`) and the repeat index (interleaved repeats of a sweep).
    Rows written before knobs and repeats existed read as ``""`` and 0."""
    layout = ""
    if tp is not None and pp is not None \
            and (int(tp), int(pp)) != default_parallel_sizes(mode, int(n))[:2]:
        layout = f"tp{int(tp)}.pp{int(pp)}"
    return (mode, model, int(seq_len), int(dec_seq_len), int(n), int(batch_size), str(ckpt),
            layout, knobs or "", int(repeat or 0))


@dataclass(frozen=True)
class ConfigLine:
    """One parsed (not yet expanded) config line."""

    mode: str
    model: str
    gpus: Union[Tuple[int, ...], str]  # explicit counts or "pow2"
    seq_len: int
    dec_seq_len: int
    batch_expr: str
    ckpt: str
    source: str
    options: Tuple[Tuple[str, object], ...] = ()


@dataclass(frozen=True)
class RunSpec:
    """One benchmark run: a config line at one GPU/rank count ``n``.

    ``key`` (mode, model, seq, dec, n, batch, ckpt, layout, knobs, repeat) identifies the run in
    a results file; it does not include ``source`` or the other run options, so moving a line or
    changing ``steps`` keeps it. ``knobs``: model-schedule knobs, canonical text
    (:mod:`end2end.spec.knobs`); ``repeat``: the index of an interleaved repeat (0 = the first).
    ``fp32_masters``: a plain-PyTorch mode in fp16/bf16 keeps fp32 master weights and optimizer
    states (:attr:`~end2end.spec.modes.Mode.master_weights`); the other modes keep them anyway.
    """

    mode: str
    model: str
    n: int
    seq_len: int
    dec_seq_len: int
    batch_size: int
    ckpt: str
    batch_expr: str = field(default="", compare=False)
    source: str = field(default="", compare=False)
    steps: Optional[int] = field(default=None, compare=False)
    warmup: Optional[int] = field(default=None, compare=False)
    dtype: Optional[str] = field(default=None, compare=False)
    tp: Optional[int] = field(default=None, compare=False)
    pp: Optional[int] = field(default=None, compare=False)
    micro_batch: Optional[int] = field(default=None, compare=False)
    knobs: str = ""
    repeat: int = 0
    save_every: Optional[int] = field(default=None, compare=False)
    resume: Optional[str] = field(default=None, compare=False)
    fp32_masters: Optional[bool] = field(default=None, compare=False)

    @property
    def key(self) -> Tuple:
        tp, pp, _ = self.parallel_sizes
        return run_key(self.mode, self.model, self.seq_len, self.dec_seq_len, self.n,
                       self.batch_size, self.ckpt, tp, pp, self.knobs, self.repeat)

    @property
    def mode_info(self) -> Mode:
        """The run's entry in the table of modes."""
        return get_mode(self.mode)

    @property
    def framework(self) -> str:
        """``megatron``, ``deepspeed``, ``fsdp`` (FSDP2) or ``torch`` (eager / slapo on plain
        PyTorch, DTensor TP): :attr:`Mode.framework`."""
        return self.mode_info.framework

    @property
    def is_slapo(self) -> bool:
        return self.mode_info.slapo

    @property
    def ckpt_ratio(self) -> Optional[float]:
        """Fraction of layers to checkpoint (``full`` and ``op`` = 1.0); None for Megatron
        ``selective``."""
        if self.ckpt == "selective":
            return None
        return 1.0 if self.ckpt == "full" or self.ckpt in SELECTIVE_CKPT else float(self.ckpt)

    @property
    def ckpt_policy(self) -> str:
        """The Slapo checkpoint policy of a selective CKPT (``op``: :data:`SELECTIVE_CKPT`);
        ``""`` (whole layers) otherwise."""
        return SELECTIVE_CKPT.get(self.ckpt, "")

    @property
    def recompute_granularity(self) -> Optional[str]:
        """Megatron's ``--recompute-granularity`` (``full``/``selective``) or None."""
        return self.ckpt if self.ckpt in ("full", "selective") else None

    @property
    def parallel_sizes(self) -> Tuple[int, int, int]:
        """(TP, PP, DP): the line's ``tp``/``pp`` directive, else
        :func:`default_parallel_sizes`."""
        if self.tp or self.pp:
            tp, pp = self.tp or 1, self.pp or 1
            return (tp, pp, max(1, self.n // (tp * pp)))
        return default_parallel_sizes(self.mode, self.n)

    @property
    def label(self) -> str:
        text = f"{self.mode} {self.model} n={self.n} bs={self.batch_size} ckpt={self.ckpt}"
        if self.knobs:
            text += f" [{self.knobs}]"
        return text + (f" (repeat {self.repeat})" if self.repeat else "")

    @property
    def torch_dtype_name(self) -> str:
        """The torch name of the run's dtype (``float32`` when unset): :data:`DTYPES`."""
        return DTYPES[self.dtype or "fp32"]

    @property
    def torch_dtype(self) -> Any:
        """The run's ``torch.dtype`` (``torch.float32`` when unset)."""
        import torch

        return getattr(torch, self.torch_dtype_name)

    @property
    def low_precision_dtype(self) -> Any:
        """The ``torch.dtype`` of a fp16/bf16 run, ``None`` for fp32 (what the runtimes take:
        ``make_runner(dtype=...)``, the inputs' dtype)."""
        return None if (self.dtype or "fp32") == "fp32" else self.torch_dtype

    def to_json(self) -> str:
        """The spec as JSON (every field; :meth:`from_json` reads it back equal)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        """The RunSpec of :meth:`to_json`; ``ValueError`` naming unknown or missing fields."""
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"RunSpec.from_json: unknown field(s) {unknown}; expected the "
                             "fields of RunSpec.to_json()")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"RunSpec.from_json: {exc}") from None

    def cli_args(self) -> List[str]:
        """Arguments of ``python -m end2end.bench`` for this run (without ``--results``)."""
        args = ["--mode", self.mode, "--model", self.model, "--seq-len", str(self.seq_len),
                "--dec-seq-len", str(self.dec_seq_len), "--batch-size", str(self.batch_size),
                "--ckpt", self.ckpt]
        for name, value in (("--steps", self.steps), ("--warmup", self.warmup),
                            ("--dtype", self.dtype), ("--tp", self.tp), ("--pp", self.pp),
                            ("--micro-batch-size", self.micro_batch)):
            if value is not None:
                args += [name, str(value)]
        for item in filter(None, self.knobs.split(",")):
            args += ["--knob", item]
        for name, value in (("--save-every", self.save_every), ("--resume", self.resume)):
            if value is not None:
                args += [name, str(value)]
        if self.fp32_masters:
            args.append("--fp32-masters")
        return args + (["--repeat", str(self.repeat)] if self.repeat else [])
