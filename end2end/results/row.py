"""One results row: the columns of a results file, :class:`ResultRow` (one run's outcome), and
how a row's values become cells and back. :mod:`end2end.results.store` writes and reads the
files (re-exporting these names); the columns and their units are described there.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Optional, Sequence, Tuple

from slapo.errors import ConfigError

from end2end.spec.config_file import RunSpec, format_ratio, run_key

__all__ = ["COLUMNS", "ARTIFACT_COLUMNS", "EXTRA_COLUMNS", "STATUSES", "SIMULATED_STATUSES",
           "NA", "ResultsError", "ResultRow", "COLUMN_TYPES", "env_columns"]

ARTIFACT_COLUMNS = ("Impl Model Seq DecSeq nGPU Batch Ckpt PerGPUParam Thrpt PerGPUMem "
                    "PerGPUTFLOPS").split()
EXTRA_COLUMNS = ("Status MFU StepTime PeakTFLOPS GitCommit Torch Transformers DeepSpeed "
                 "MegatronCore Device World TP PP DP Dtype Steps Time Error Knobs Repeat "
                 "Machine Resumed").split()
COLUMNS = tuple(ARTIFACT_COLUMNS + EXTRA_COLUMNS)
STATUSES = ("ok", "oom", "fail", "timeout", "skipped", "sim", "sim-oom")
# rows predicted by ``python -m end2end.simulate`` (docs/simulate.md), never measured ones
SIMULATED_STATUSES = ("sim", "sim-oom")
NA = "na"
MAX_ERROR = 500


class ResultsError(ConfigError):
    """A results file is malformed or incompatible."""


@dataclass
class ResultRow:
    """One run's outcome; attribute ``impl`` is the TSV column ``Impl`` etc. (see ``COLUMNS``)."""

    impl: str
    model: str
    seq: int
    dec_seq: int
    ngpu: int
    batch: int
    ckpt: str
    per_gpu_param: Optional[float] = None
    thrpt: Optional[float] = None
    per_gpu_mem: Optional[float] = None
    per_gpu_tflops: Optional[float] = None
    status: str = "ok"
    mfu: Optional[float] = None
    step_time: Optional[float] = None
    peak_tflops: Optional[float] = None
    git_commit: str = ""
    torch: str = ""
    transformers: str = ""
    deepspeed: str = ""
    megatron_core: str = ""
    device: str = ""
    world: Optional[int] = None
    tp: Optional[int] = None
    pp: Optional[int] = None
    dp: Optional[int] = None
    dtype: str = ""
    steps: Optional[int] = None
    time: str = ""
    error: str = ""
    knobs: str = ""
    repeat: int = 0
    machine: str = ""  # "quiet (...)"/"busy (...)": the sweep's watch (end2end.sweep.quiet)
    resumed: str = ""  # "from step K": continued from a saved state (end2end.driver.resume)
    extra: Dict[str, Any] = field(default_factory=dict)  # JSON twin only (breakdowns, logs)

    @classmethod
    def from_spec(cls, spec: RunSpec, status: str = "ok", **values: Any) -> "ResultRow":
        """A row for ``spec``; ``values`` fill metric/env fields (``ResultRow`` attribute names)."""
        tp, pp, dp = spec.parallel_sizes
        base = dict(impl=spec.mode, model=spec.model, seq=spec.seq_len, dec_seq=spec.dec_seq_len,
                    ngpu=spec.n, batch=spec.batch_size, ckpt=spec.ckpt, status=status,
                    world=spec.n, tp=tp, pp=pp, dp=dp, dtype=spec.dtype or "",
                    steps=spec.steps, knobs=spec.knobs, repeat=spec.repeat)
        base.update(values)
        row = cls(**base)
        if spec.fp32_masters:  # a run option outside the key: said in the JSON twin
            row.extra = dict(row.extra, fp32_masters=True)
        return row

    @property
    def key(self) -> Tuple:
        return run_key(self.impl, self.model, self.seq, self.dec_seq, self.ngpu, self.batch,
                       _canonical_ckpt(self.ckpt), self.tp, self.pp, self.knobs, self.repeat)

    def validate(self) -> None:
        if self.status not in STATUSES:
            raise ResultsError(f"status {self.status!r} is not one of {STATUSES}")
        if self.status in ("ok", "sim") and (self.thrpt is None or not math.isfinite(self.thrpt)):
            raise ResultsError(f"row {self.key} has status ok but no throughput",
                               hint="use status fail with an error message")
        if self.status not in ("ok", "sim") and not self.error:
            raise ResultsError(f"row {self.key} has status {self.status} but no error message")


_FIELDS = [f for f in fields(ResultRow) if f.name != "extra"]
assert len(_FIELDS) == len(COLUMNS)
_COLUMN_OF = {f.name: col for f, col in zip(_FIELDS, COLUMNS)}
# What a cell holds: "int" (every row has one), "number" (a number or ``na``), or "text".
COLUMN_TYPES = {_COLUMN_OF[f.name]: "int" if f.type == "int" else "number"
                if "int" in f.type or "float" in f.type else "text" for f in _FIELDS}


def _canonical_ckpt(text: str) -> str:
    try:
        return format_ratio(float(text))
    except ValueError:
        return text.strip().lower()


def _cell(value: Any) -> str:
    if value is None:
        return NA
    if isinstance(value, float):
        return NA if not math.isfinite(value) else f"{value:.6g}"
    return " ".join(str(value).split())[:MAX_ERROR]  # no tabs/newlines inside a cell


def _parse_cell(f: dataclasses.Field, text: str) -> Any:
    kind = COLUMN_TYPES[_COLUMN_OF[f.name]]
    if kind != "text":
        if text in (NA, "", "oom", "fail", "nan"):
            if kind == "int":
                raise ValueError(f"{f.name} is {text!r}")
            return None
        return int(text) if "int" in f.type else float(text)
    return text


def _json_value(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def env_columns(env: Dict[str, Any]) -> Dict[str, Any]:
    """The ``ResultRow`` environment fields taken from an ``env_dump()`` dict."""
    return dict(git_commit=env.get("git_commit", ""), torch=env.get("torch", ""),
                transformers=env.get("transformers", ""), deepspeed=env.get("deepspeed", ""),
                megatron_core=env.get("megatron_core", ""), device=env.get("device", ""))


def _row_from_cells(cells: Sequence[str], columns: Sequence[str]) -> ResultRow:
    by_col = dict(zip(columns, cells))
    values: Dict[str, Any] = {}
    for f in _FIELDS:
        col = _COLUMN_OF[f.name]
        if col in by_col:
            values[f.name] = _parse_cell(f, by_col[col])
    if "Status" not in by_col:  # artifact format: "na oom oom oom" / "na fail fail fail"
        thrpt = by_col.get("Thrpt", "")
        values["status"] = thrpt if thrpt in ("oom", "fail") else "ok"
        if values["status"] != "ok":
            values["error"] = f"{thrpt} (artifact row)"
    return ResultRow(**values)
