"""Benchmark config files: the artifact's line grammar, parsed and expanded into typed runs.

One benchmark case per line (whitespace separated, shell-style quotes)::

    MODE MODEL GPUS SEQ_LEN DEC_SEQ_LEN BATCH_SIZE CKPT
    slapo-megatron bert-xlarge 2,4,8 512 0 "min(8*n, 48)" 0

* ``#`` starts a comment (whole line or trailing); blank lines are skipped.
* MODE: ``megatron slapo-megatron deepspeed slapo-deepspeed eager slapo`` and the PyTorch peers
  ``fsdp slapo-fsdp dtensor-tp`` (the table of modes, :mod:`end2end.spec.modes`).
* MODEL: a name from the zoo (``python -m end2end.models``), a zoo family with the zoo's field
  names as overrides ``FAMILY:key=value,...`` (``gpt2:layers=24,hidden=1920,heads=15``) or the
  path of an HF ``config.json`` (:mod:`end2end.models.shaped`).
* GPUS: ``2``, ``2,4,8`` or ``pow2`` (1, 2, 4, ... up to the largest power of two <= the
  available devices/ranks, passed as ``max_devices``). On CPU "GPUs" are gloo ranks.
* SEQ_LEN (encoder length; WideResNet ignores it, write 1), DEC_SEQ_LEN (T5 only, else 0).
* BATCH_SIZE: global batch, an expression in ``n`` (see :mod:`end2end.spec.expr`; never ``eval``).
* CKPT: Slapo modes: a ratio in [0, 1] (``full`` = 1), or ``op``: every layer checkpointed
  selectively (torchtitan's selective "op" checkpointing: the outputs of every second matmul and
  of the attention kernels kept, the rest recomputed; :data:`SELECTIVE_CKPT`);
  ``megatron``: ``0``/``full``/``selective``; ``deepspeed``/``eager``/``fsdp``/``dtensor-tp``:
  ``0``/``1`` (``full`` = 1, HF gradient checkpointing).
  Quirk fixed: the artifact's ``megatron ... 1`` line passed ``--recompute-granularity 1`` to
  Megatron (an invalid choice, the run failed); here ``1`` means ``full`` with a warning, or an
  error with ``strict=True``.
* ``#@ steps=10 warmup=2 dtype=fp32`` sets run options for the following lines (the artifact's
  parser skips such lines as comments, so files stay compatible). Options: ``steps``,
  ``warmup``, ``dtype`` (fp32/fp16/bf16), ``tp``, ``pp``, ``micro_batch`` (multi-node layouts;
  default: the artifact's, see :attr:`RunSpec.parallel_sizes`), ``knobs`` (model-schedule
  knobs of the Slapo modes, the rest of the pragma: ``#@ knobs=shard_embedding=False``; an
  empty ``#@ knobs=`` drops them; see :mod:`end2end.spec.knobs`), ``save_every`` and ``resume``
  (the driver's ``--save-every N`` / ``--resume DIR``: each run saves into, and resumes from, its
  own ``<results>.state/<run>`` directory, :mod:`end2end.driver.resume`), ``fp32_masters``
  (``1``/``0``, with dtype fp16/bf16: the plain-PyTorch modes keep fp32 master weights and
  optimizer states as apex's O2 does, the driver's ``--fp32-masters``; the modes that always
  keep them are unchanged, :attr:`~end2end.spec.modes.Mode.master_weights`); ``#@ reset``
  clears them all.

Errors name the place: ``cpu.cfg:7: CKPT 'half' is not valid for mode 'slapo'. Hint: ...``.
"""

from __future__ import annotations

import shlex
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from slapo.errors import ConfigError, SlapoError

from end2end.spec.expr import check_expression, evaluate_batch_size
from end2end.spec.knobs import check_run_knobs, format_knobs, parse_knobs
from end2end.models import get_model_spec
from end2end.models.shaped import valid_keys
from end2end.spec.modes import RETIRED_MODES, get_mode
from end2end.spec.runspec import DTYPES as _DTYPE_NAMES
from end2end.spec.runspec import (MODES, SELECTIVE_CKPT, SLAPO_MODES, ConfigLine, RunSpec,
                                  default_parallel_sizes, format_ratio, run_key)

__all__ = [
    "MODES", "SLAPO_MODES", "ConfigLineError", "ConfigWarning", "ConfigLine", "RunSpec",
    "parse_config", "parse_lines", "expand", "load_runs", "format_ratio", "run_key",
    "default_parallel_sizes",
    "make_run_spec", "with_options", "interleave",
]

FIELDS = "MODE MODEL GPUS SEQ_LEN DEC_SEQ_LEN BATCH_SIZE CKPT"
OPTION_KEYS = ("steps", "warmup", "dtype", "tp", "pp", "micro_batch", "knobs", "save_every",
               "resume", "fp32_masters")
_FLAGS = {"1": True, "true": True, "0": False, "false": False}
DTYPES = tuple(_DTYPE_NAMES)  # fp32 fp16 bf16


class ConfigLineError(ConfigError):
    """A config line is invalid; the message starts with ``file:line:``."""

    def __init__(self, source: str, reason: str, hint: Optional[str] = None):
        self.source, self.reason = source, reason
        super().__init__(f"{source}: {reason}", hint=hint)


class ConfigWarning(UserWarning):
    """A config line was accepted with a reinterpretation (e.g. megatron CKPT 1 -> full)."""


def _parse_ckpt(mode: str, text: str, source: str, strict: bool) -> str:
    """Validate CKPT for ``mode`` and return its canonical text."""
    t = text.strip().lower()
    kind = get_mode(mode).ckpt
    if kind == "megatron":
        if t in ("full", "selective"):
            return t
        if t in ("0", "0.0"):
            return "0"
        if t in ("1", "1.0") and not strict:
            warnings.warn(ConfigWarning(
                f"{source}: megatron CKPT '{text}' read as 'full' (the artifact passed it to "
                f"--recompute-granularity, which only accepts full/selective)"), stacklevel=4)
            return "full"
        raise ConfigLineError(source, f"CKPT {text!r} is not valid for mode 'megatron'",
                              hint="use 0, full or selective")
    if kind == "hf":
        if t in ("0", "0.0"):
            return "0"
        if t in ("1", "1.0", "full"):
            return "1"
        raise ConfigLineError(source, f"CKPT {text!r} is not valid for mode '{mode}'",
                              hint="the baseline only has HF gradient checkpointing on (1) or "
                                   "off (0); partial ratios and op need a Slapo mode")
    if t == "full":
        return "1"
    if t in SELECTIVE_CKPT:
        return t
    try:
        ratio = float(t)
    except ValueError:
        raise ConfigLineError(source, f"CKPT {text!r} is not valid for mode '{mode}'",
                              hint="give a checkpoint ratio between 0 and 1, e.g. 0.5, or "
                                   "op (selective checkpointing of every layer)") from None
    if not 0.0 <= ratio <= 1.0:
        raise ConfigLineError(source, f"CKPT ratio {text!r} is outside [0, 1]",
                              hint="0 = no checkpointing, 1 = every layer")
    return format_ratio(ratio)


def _parse_gpus(text: str, source: str) -> Union[Tuple[int, ...], str]:
    if text.lower() == "pow2":
        return "pow2"
    counts: List[int] = []
    for item in text.split(","):
        try:
            value = int(item)
        except ValueError:
            raise ConfigLineError(source, f"GPUS {text!r} is not a count list",
                                  hint="write 2, 2,4,8 or pow2") from None
        if value < 1:
            raise ConfigLineError(source, f"GPUS {text!r} contains {value}",
                                  hint="counts must be >= 1")
        if value not in counts:
            counts.append(value)
    return tuple(counts)


def _parse_int(name: str, text: str, source: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigLineError(source, f"{name} {text!r} is not an integer") from None
    if value < minimum:
        raise ConfigLineError(source, f"{name} is {value}", hint=f"it must be >= {minimum}")
    return value


def _parse_options(text: str, source: str, options: Dict[str, object]) -> None:
    """``#@ key=value ...`` pragma: update ``options`` in place."""
    for item in text.split():
        if item == "reset":
            options.clear()
            continue
        key, sep, value = item.partition("=")
        if not sep or key not in OPTION_KEYS:
            raise ConfigLineError(source, f"unknown option {item!r}",
                                  hint=f"options are {', '.join(k + '=' for k in OPTION_KEYS)}")
        if key == "dtype":
            if value not in DTYPES:
                raise ConfigLineError(source, f"dtype {value!r} is not one of {DTYPES}")
            options[key] = value
        elif key == "fp32_masters":
            if value.lower() not in _FLAGS:
                raise ConfigLineError(source, f"fp32_masters={value!r} is not a flag",
                                      hint="write fp32_masters=1 (or 0)")
            options[key] = _FLAGS[value.lower()]
        elif key == "resume":
            if not value:
                raise ConfigLineError(source, "resume= names no directory",
                                      hint="write #@ resume=DIR (a --save-every directory)")
            options[key] = value
        elif key == "knobs":  # the rest of the line: knobs=a=1,b=x (empty: reset)
            try:
                options[key] = format_knobs(parse_knobs(text.split("knobs=", 1)[1].strip(),
                                                        source))
            except ConfigError as exc:
                raise ConfigLineError(source, exc.what.removeprefix(f"{source}: "),
                                      hint=exc.hint) from None
            if not options[key]:
                del options[key]
            return
        else:
            options[key] = _parse_int(key, value, source, 0 if key == "warmup" else 1)


def _parse_line(tokens: List[str], source: str, strict: bool,
                options: Dict[str, object]) -> ConfigLine:
    if len(tokens) != 7:
        raise ConfigLineError(source, f"expected 7 fields ({FIELDS}), got {len(tokens)}",
                              hint="quote a BATCH_SIZE expression that contains spaces")
    mode, model, gpus, seq, dec, batch, ckpt = tokens
    if mode not in MODES:
        hint = f"modes are {', '.join(MODES)}"
        if mode in RETIRED_MODES:
            hint = f"{RETIRED_MODES[mode]}; {hint}"
        raise ConfigLineError(source, f"unknown MODE {mode!r}", hint=hint)
    try:
        spec = get_model_spec(model)
    except SlapoError as exc:
        raise ConfigLineError(source, exc.what, hint=exc.hint) from None
    seq_len = _parse_int("SEQ_LEN", seq, source, 1)
    dec_len = _parse_int("DEC_SEQ_LEN", dec, source, 0)
    if spec.is_encoder_decoder and dec_len < 1:
        raise ConfigLineError(source, f"{model} is an encoder-decoder model: DEC_SEQ_LEN is 0",
                              hint="give the decoder length, e.g. 512")
    if not spec.is_encoder_decoder and dec_len:
        raise ConfigLineError(source, f"DEC_SEQ_LEN {dec_len} given for {model}, which has no "
                              "decoder", hint="write 0")
    if not spec.is_vision and seq_len > spec.max_positions:
        hint = "shorten the sequence"
        if "max_positions" in valid_keys(spec.family) and ":" in model:
            hint += f" or add max_positions={seq_len} to the shape"
        raise ConfigLineError(source, f"SEQ_LEN {seq_len} exceeds the {spec.max_positions} "
                              f"positions of {model}", hint=hint)
    try:
        check_expression(batch)
        check_run_knobs(mode, spec.schedule, str(options.get("knobs", "")), source)
    except SlapoError as exc:
        raise ConfigLineError(source, exc.what.removeprefix(f"{source}: "),
                              hint=exc.hint) from None
    ckpt = _parse_ckpt(mode, ckpt, source, strict)
    if ckpt in SELECTIVE_CKPT and spec.is_vision:
        raise ConfigLineError(source, f"CKPT {ckpt!r} is not available for {model}",
                              hint="a convolutional network has no matmuls or attention to keep: "
                                   "give a ratio")
    line = ConfigLine(mode, model, _parse_gpus(gpus, source), seq_len, dec_len, batch, ckpt,
                      source, tuple(sorted(options.items())))
    if line.gpus != "pow2":  # evaluate now: errors surface at parse time
        _batch_sizes(line, line.gpus)
    return line


def parse_lines(lines: Iterable[str], filename: str = "<config>",
                strict: bool = False) -> List[ConfigLine]:
    """Parse config text (an iterable of lines); errors are :class:`ConfigLineError`."""
    out: List[ConfigLine] = []
    options: Dict[str, object] = {}
    for lineno, raw in enumerate(lines, start=1):
        source = f"{filename}:{lineno}"
        text = raw.strip()
        if text.startswith("#@"):
            _parse_options(text[2:], source, options)
            continue
        try:
            tokens = shlex.split(text, comments=True)
        except ValueError as exc:
            raise ConfigLineError(source, f"cannot split the line ({exc})",
                                  hint="check the quotes") from None
        if tokens:
            out.append(_parse_line(tokens, source, strict, options))
    return out


def parse_config(path: Union[str, Path], strict: bool = False) -> List[ConfigLine]:
    """Parse a config file (see the module docstring for the grammar)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config {str(path)!r}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8-sig")  # a BOM (Windows editors) is not part of line 1
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigLineError(f"{path}:{line}", f"the file is not UTF-8 (byte "
                              f"{data[exc.start]:#04x})", hint="save the config as UTF-8 "
                              "(configs are ASCII: modes, model names, numbers)") from None
    return parse_lines(text.splitlines(), filename=str(path), strict=strict)


def _batch_sizes(line: ConfigLine, counts: Sequence[int]) -> Dict[int, int]:
    sizes = {}
    for n in counts:
        try:
            sizes[n] = evaluate_batch_size(line.batch_expr, n)
        except SlapoError as exc:
            raise ConfigLineError(line.source, exc.what, hint=exc.hint) from None
    return sizes


def _pow2_counts(max_devices: Optional[int], source: str) -> Tuple[int, ...]:
    if max_devices is None or max_devices < 1:
        raise ConfigLineError(source, "GPUS is pow2 but the number of available devices is "
                              "unknown", hint="pass max_devices (e.g. --max-devices 8)")
    counts, n = [], 1
    while n <= max_devices:
        counts.append(n)
        n *= 2
    return tuple(counts)


def expand(lines: Sequence[ConfigLine], max_devices: Optional[int] = None) -> List[RunSpec]:
    """One :class:`RunSpec` per line and GPU count, in file order; exact duplicates (same key)
    are dropped with a :class:`ConfigWarning`."""
    runs: List[RunSpec] = []
    seen: Dict[tuple, str] = {}
    for line in lines:
        counts = (_pow2_counts(max_devices, line.source) if line.gpus == "pow2"
                  else line.gpus)
        for n, batch in _batch_sizes(line, counts).items():
            opts = dict(line.options)
            spec = RunSpec(line.mode, line.model, n, line.seq_len, line.dec_seq_len, batch,
                           line.ckpt, line.batch_expr, line.source, **opts)
            _check_layout(spec)
            if spec.key in seen:
                warnings.warn(ConfigWarning(f"{line.source}: duplicate of {seen[spec.key]} "
                                            f"({spec.label}); skipped"), stacklevel=2)
                continue
            seen[spec.key] = line.source
            runs.append(spec)
    return runs


def _check_layout(spec: RunSpec) -> None:
    tp, pp, dp = spec.parallel_sizes
    if spec.fp32_masters:
        if (spec.dtype or "fp32") == "fp32":
            raise ConfigLineError(spec.source, "fp32_masters=1 in an fp32 run",
                                  hint="set dtype=fp16 or dtype=bf16 (an fp32 run's weights "
                                  "are its masters), or drop fp32_masters")
        try:
            spec.mode_info.check_fp32_masters(pp)
        except ConfigError as exc:
            raise ConfigLineError(spec.source, exc.what, hint=exc.hint) from None
    if tp * pp * dp != spec.n:
        raise ConfigLineError(spec.source, f"tp={tp} x pp={pp} does not divide n={spec.n}",
                              hint="choose GPU counts that are multiples of tp*pp")
    micro = spec.micro_batch
    if micro and spec.batch_size % (micro * dp):
        raise ConfigLineError(spec.source, f"batch {spec.batch_size} is not a multiple of "
                              f"micro_batch {micro} x dp {dp} at n={spec.n}")


def load_runs(path: Union[str, Path], max_devices: Optional[int] = None,
              strict: bool = False) -> List[RunSpec]:
    """``expand(parse_config(path), max_devices)``: the runs of a config file."""
    return expand(parse_config(path, strict=strict), max_devices)


def make_run_spec(mode: str, model: str, n: int, seq_len: int, dec_seq_len: int,
                  batch_size: int, ckpt: str, source: str = "<command line>",
                  **options: object) -> RunSpec:
    """A validated :class:`RunSpec` from command-line values (the driver's entry point): the
    same checks and canonical CKPT as a config line. ``options``: steps, warmup, dtype, tp, pp,
    micro_batch, knobs (canonical text), repeat (None = unset)."""
    text = shlex.join([mode, model, str(n), str(seq_len), str(dec_seq_len), str(batch_size),
                       str(ckpt)])
    (spec,) = expand(parse_lines([text], source))
    spec = replace(spec, **{k: v for k, v in options.items() if v is not None})
    _check_layout(spec)
    if spec.repeat < 0:
        raise ConfigLineError(source, f"repeat index {spec.repeat} is negative")
    try:
        check_run_knobs(spec.mode, get_model_spec(spec.model).schedule, spec.knobs)
    except SlapoError as exc:
        raise ConfigLineError(source, exc.what, hint=exc.hint) from None
    return spec


def interleave(runs: Sequence[RunSpec], repeat: int) -> List[RunSpec]:
    """``repeat`` interleaved rounds: every run once (repeat index 0), then every run again
    (index 1) ..., so a drifting machine slows every run of a round alike."""
    if not isinstance(repeat, int) or repeat < 1:
        raise ConfigError(f"repeat {repeat!r}: the number of rounds must be at least 1",
                          hint="e.g. --repeat 3")
    return [replace(s, repeat=r) for r in range(repeat) for s in runs]


def with_options(spec: RunSpec, **options: object) -> RunSpec:
    """A copy of ``spec`` with run options (steps/warmup/dtype) overridden."""
    return replace(spec, **options)
