"""The published layouts the planner is checked against: ``docs/results/plan/published_layouts.tsv``
(issue 40, item 3; the comparison is :mod:`end2end.plan.published`).

One tab-separated row per published training run whose layout its authors chose: the model in
the project's syntax, the cluster as the planner reads it (``a100-80gb:8x4``), sequence, global
batch, the dtype simulated, the project's closest mode, the published TP / PP / DP, micro-batch
and recomputation (the mode's CKPT), the Slapo recipe's knobs the run needs (canonical text, as
in a ``#@ knobs=`` pragma), what the source states, its throughput, where it is
written, and what the project cannot express about the run. Lines starting with ``#`` are
comments; the first other line is the header, exactly :data:`COLUMNS`.

:func:`read_layouts` checks what a row says by itself: numbers, a known mode, dtype and metric, a
cluster that parses, a model the project can build, ``TP x PP x DP`` = the cluster's GPUs, a
global batch that DP x micro-batch divides, knobs the mode's recipe takes (in canonical form),
and for the modes that run the replica's whole batch at once (no gradient accumulation: not
megatron, no pipeline) a micro-batch equal to it. A
mistake is one line naming the file, the line and the row's id (:class:`LayoutTableError`).
Whether the driver runs the layout (a CKPT the mode takes, stages that divide the layers) is
found when the row is compared, and a refusal is that row's result, not a parse error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import List, Optional

from slapo.errors import ConfigError, SlapoError

from end2end.plan.space import Candidate
from end2end.spec.modes import get_mode
from end2end.spec.runspec import DTYPES

__all__ = ["COLUMNS", "METRICS", "DEFAULT_TABLE", "LayoutTableError", "PublishedLayout",
           "parse_layouts", "read_layouts"]

DEFAULT_TABLE = Path(__file__).resolve().parents[2] / "docs/results/plan/published_layouts.tsv"
COLUMNS = ("id", "model", "cluster", "seq", "global_batch", "dtype", "mode", "tp", "pp", "dp",
           "micro", "ckpt", "knobs", "published_layout", "published_metric", "published_value",
           "source", "location", "version", "cannot_express")
METRICS = ("tokens_per_s_per_gpu", "tokens_per_s", "megatron_tflops_per_gpu", "none")
_INTS = ("seq", "global_batch", "tp", "pp", "dp", "micro")


class LayoutTableError(ConfigError):
    """A row of the published-layout table that cannot be read (one line: file, line, id)."""


@dataclass(frozen=True)
class PublishedLayout:
    """One row of the table (module docstring); ``line``: its line in the file."""

    id: str
    model: str
    cluster: str
    seq: int
    global_batch: int
    dtype: str
    mode: str
    tp: int
    pp: int
    dp: int
    micro: int
    ckpt: str
    knobs: str
    published_layout: str
    published_metric: str
    published_value: Optional[float]
    source: str
    location: str
    version: str
    cannot_express: str
    line: int = 0

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def candidate(self, model: str = "") -> Candidate:
        """The published layout as a planner candidate (``model``: the name the planner
        resolved it to, e.g. with more positions)."""
        return Candidate(mode=self.mode, model=model or self.model, n=self.gpus, seq=self.seq,
                         dec=0, batch=self.global_batch, ckpt=self.ckpt, dtype=self.dtype,
                         tp=self.tp, pp=self.pp, micro=self.micro, knobs=self.knobs)

    def measured_samples_s(self) -> Optional[float]:
        """The published throughput as samples/s of the whole job (``None`` without one);
        Megatron-LM's TFLOP/s by its paper's count (:func:`megatron_flops_per_sample`)."""
        v = self.published_value
        if v is None or self.published_metric == "none":
            return None
        if self.published_metric == "tokens_per_s":
            return v / self.seq
        if self.published_metric == "tokens_per_s_per_gpu":
            return v * self.gpus / self.seq
        from end2end.simulate.validate import megatron_flops_per_sample

        flops = megatron_flops_per_sample(SimpleNamespace(model=self.model, seq_len=self.seq))
        return v * 1e12 * self.gpus / flops


def _error(where: str, problem: str, hint: str = "") -> LayoutTableError:
    return LayoutTableError(f"{where}: {' '.join(problem.split())}", call="end2end.plan.published",
                            hint=hint or "fix the row (the columns are described in the file's "
                                         "header comment)")


def _row(fields: List[str], where: str, line: int) -> PublishedLayout:
    values = dict(zip(COLUMNS, fields))
    for key in _INTS:
        try:
            number = int(values[key])
        except ValueError:
            raise _error(where, f"{key} {values[key]!r} is not an integer") from None
        if number < 1:
            raise _error(where, f"{key} {number} is below 1")
        values[key] = number
    metric, value = values["published_metric"], values["published_value"].strip()
    if metric not in METRICS:
        raise _error(where, f"published_metric {metric!r} is unknown",
                     hint="use one of " + ", ".join(METRICS))
    if (metric == "none") != (value == ""):
        raise _error(where, f"published_value {value!r} does not go with metric {metric!r}",
                     hint="give a number for a metric, and leave it empty for 'none'")
    try:
        values["published_value"] = float(value) if value else None
    except ValueError:
        raise _error(where, f"published_value {value!r} is not a number") from None
    layout = PublishedLayout(line=line, **values)
    _check(layout, where)
    return layout


def _check(row: PublishedLayout, where: str) -> None:
    """What a row must say by itself (module docstring)."""
    from end2end.models import get_model_spec
    from end2end.plan.cluster import parse_cluster

    if row.dtype not in DTYPES:
        raise _error(where, f"dtype {row.dtype!r} is unknown", hint="use one of "
                     + ", ".join(DTYPES))
    try:
        get_mode(row.mode)
        cluster = parse_cluster(row.cluster)
        get_model_spec(row.model)
    except SlapoError as exc:
        raise _error(where, exc.what, exc.hint or "") from None
    if row.knobs:
        from end2end.spec.knobs import check_run_knobs, format_knobs, parse_knobs

        try:
            check_run_knobs(row.mode, get_model_spec(row.model).schedule, row.knobs, "knobs")
            canonical = format_knobs(parse_knobs(row.knobs, "knobs"))
        except SlapoError as exc:
            raise _error(where, exc.what, exc.hint or "") from None
        if canonical != row.knobs:
            raise _error(where, f"knobs {row.knobs!r} are not in canonical form",
                         hint=f"write {canonical!r}")
    if row.gpus != cluster.gpus:
        raise _error(where, f"tp {row.tp} x pp {row.pp} x dp {row.dp} = {row.gpus} GPUs, but "
                     f"{row.cluster} has {cluster.gpus}")
    if row.global_batch % (row.dp * row.micro):
        raise _error(where, f"global_batch {row.global_batch} is not a multiple of dp {row.dp} "
                     f"x micro {row.micro}")


def parse_layouts(text: str, name: str = "<table>") -> List[PublishedLayout]:
    """The rows of a table's ``text`` (module docstring); ``name`` is the file in errors."""
    header_seen, rows, ids = False, [], set()
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        fields = raw.split("\t")
        if not header_seen:
            if tuple(fields) != COLUMNS:
                raise _error(f"{name}:{number}", "the header is not the expected columns",
                             hint="the header line is: " + " ".join(COLUMNS)
                             + " (tab-separated)")
            header_seen = True
            continue
        where = f"{name}:{number} ({fields[0] or 'no id'})"
        if len(fields) != len(COLUMNS):
            raise _error(where, f"{len(fields)} tab-separated fields, expected {len(COLUMNS)}")
        if not fields[0] or fields[0] in ids:
            raise _error(where, "the id is empty" if not fields[0] else "the id is used twice")
        ids.add(fields[0])
        rows.append(_row(fields, where, number))
    if not header_seen:
        raise _error(name, "no header line", hint="the header line is: " + " ".join(COLUMNS))
    return rows


def read_layouts(path: Path = DEFAULT_TABLE) -> List[PublishedLayout]:
    """The rows of the table at ``path`` (module docstring)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise LayoutTableError(f"cannot read {path}: {exc.strerror}",
                               call="end2end.plan.published",
                               hint="give --table an existing file") from None
    return parse_layouts(text, Path(path).name)
