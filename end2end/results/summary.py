"""Figure 7's numbers from results rows: one bar per (workload, GPU count, system), the median
of its repeats with min-max, and the Slapo speedups with their ranges.

A workload is a :class:`Panel` — (model, seq, dec seq): runs at other sequence lengths are never
compared. A bar is one (batch, ckpt) setting of a system: rows of one system at several settings
are refused, naming the clash, unless ``best`` takes the setting with the best median (each
system at its best batch and checkpointing, as the artifact's Figure 7 does). Rows of one setting
are repeats (the sweep's interleaved rounds, ``--repeat``): the bar is their median
(:mod:`end2end.results.stats`). A speedup is the median of the per-round ratios (rounds that
do not pair up: the ratio of the medians); with repeats it carries the range of the per-round
ratios and is "within noise" (``~``) when that range includes 1.0 (rounds that
do not pair up: when the two bars' ranges overlap).
Everything here comes from the rows; nothing is a constant.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from slapo.errors import ConfigError

from end2end.results.store import ResultRow
from end2end.results.stats import Ratio, Samples

__all__ = ["SYSTEMS", "GROUPS", "PEER_GROUPS", "PAIRS", "BASELINES", "LABEL", "COLOR",
           "PlotError", "Panel", "Cell", "Speedup", "system_of", "base_system", "label_of",
           "baselines_of", "figure7_table", "figure_systems", "panel_systems", "panel_title",
           "speedups", "format_speedups", "format_markdown"]

# (impl, legend label, colour)
SYSTEMS: Tuple[Tuple[str, str, str], ...] = (
    ("megatron", "Megatron-LM", "#4c72b0"),
    ("slapo-megatron", "Slapo-TP", "#dd8452"),
    ("deepspeed", "DeepSpeed", "#55a868"),
    ("slapo-deepspeed", "Slapo-ZeRO3", "#c44e52"),
    ("eager", "Eager", "#8172b3"),
    ("slapo", "Slapo", "#937860"),
    # today's PyTorch peers (issue 18; configs/*_peers.cfg)
    ("fsdp", "FSDP2", "#8c8c8c"),
    ("slapo-fsdp", "Slapo-FSDP2", "#da8bc3"),
    ("dtensor-tp", "DTensor-TP", "#64b5cd"),
)
# Panels show a group of systems when the model has a row of any system in it (then a missing
# member, e.g. Megatron-LM for RoBERTa, gets a grey "x"): the Figure-7 four, and the CPU pair.
GROUPS = (("megatron", "slapo-megatron", "deepspeed", "slapo-deepspeed"), ("eager", "slapo"))
# The peers figure (plot --peers): FSDP2 and DTensor TP with their Slapo counterparts.
PEER_GROUPS = (("fsdp", "slapo-fsdp", "dtensor-tp", "slapo-megatron"),)
# (Slapo system, its baseline); a Slapo bar is labelled with the first baseline of its panel
PAIRS = (("slapo-megatron", "megatron"), ("slapo-deepspeed", "deepspeed"), ("slapo", "eager"),
         ("slapo-fsdp", "fsdp"), ("slapo-megatron", "dtensor-tp"))
BASELINES = ("megatron", "deepspeed", "eager", "fsdp", "dtensor-tp")
LABEL = {impl: label for impl, label, _ in SYSTEMS}
COLOR = {impl: color for impl, _, color in SYSTEMS}


class PlotError(ConfigError):
    """The rows cannot be drawn without comparing unlike runs."""


class Panel(NamedTuple):
    """One panel of the figure: a model at one sequence length (and decoder length)."""

    model: str
    seq: int
    dec_seq: int


@dataclass(frozen=True)
class Cell:
    """One bar: the median throughput of a (system, panel, n) over the repeats of its setting,
    or the status of its failed runs."""

    thrpt: Optional[float]  # median samples/s of the ok repeats, None when none is ok
    status: str  # "ok" or the failure status (oom/fail/timeout/skipped)
    rows: int  # rows of this (system, panel, n), all settings
    batch: int = 0  # the batch of the bar (of the best setting with --best)
    settings: Tuple[Tuple[int, str], ...] = ()  # the (batch, ckpt) settings of its rows
    samples: Samples = Samples()  # (repeat, samples/s) of the bar's setting, ok rows
    failed: int = 0  # repeats of the bar's setting that were not ok


Table = Dict[Panel, Dict[int, Dict[str, Cell]]]  # panel -> n -> impl -> cell


def _failure(statuses: Sequence[str]) -> str:
    return "oom" if "oom" in statuses else statuses[0]  # oom: the most informative


def figure7_table(rows: Iterable[ResultRow], best: bool = False) -> Table:
    """Aggregate rows per (panel, n, impl) into a :class:`Cell` (see the module docstring).
    Rows of one (panel, n, impl) at different (batch, ckpt) settings raise :class:`PlotError`
    unless ``best``."""
    groups: Dict[Tuple[Panel, int, str], Dict[Tuple[int, str], List[ResultRow]]] = {}
    for row in rows:
        key = (Panel(row.model, row.seq, row.dec_seq), row.ngpu, system_of(row))
        groups.setdefault(key, defaultdict(list))[(row.batch, str(row.ckpt))].append(row)
    table: Table = {}
    for (panel, n, impl), by_setting in groups.items():
        settings = tuple(sorted(by_setting))
        if len(settings) > 1 and not best:
            shown = " and ".join(f"batch {b} ckpt {c}" for b, c in settings)
            raise PlotError(f"{label_of(impl)} {panel.model} seq {panel.seq} n={n} has "
                            f"rows at {shown}: one bar cannot show both",
                            hint="plot one setting (--models, or separate results files), or "
                                 "pass --best to take each system's best setting as the "
                                 "paper's Figure 7 does")
        cells = [_setting_cell(rs, setting, settings) for setting, rs in by_setting.items()]
        chosen = max(cells, key=lambda c: (c.thrpt is not None, c.thrpt or 0.0))
        count = sum(len(rs) for rs in by_setting.values())
        if chosen.thrpt is None:
            chosen = Cell(None, _failure([c.status for c in cells]), count, chosen.batch,
                          settings, failed=chosen.failed)
        table.setdefault(panel, {}).setdefault(n, {})[impl] = Cell(
            chosen.thrpt, chosen.status, count, chosen.batch, settings, chosen.samples,
            chosen.failed)
    return table


def _setting_cell(rows: List[ResultRow], setting: Tuple[int, str],
                  settings: Tuple[Tuple[int, str], ...]) -> Cell:
    """The cell of one setting: the median of its ok repeats (the max where a repeat index
    appears twice, e.g. a run appended to two files); else its failure status."""
    by_repeat: Dict[int, float] = {}
    failed = []
    for row in rows:
        if row.status == "ok" and row.thrpt is not None:
            by_repeat[row.repeat] = max(row.thrpt, by_repeat.get(row.repeat, 0.0))
        else:
            failed.append(row.status)
    samples = Samples.of(by_repeat.items())
    if samples:
        return Cell(samples.median, "ok", len(rows), setting[0], settings, samples, len(failed))
    return Cell(None, _failure(failed), len(rows), setting[0], settings, failed=len(failed))


def figure_systems(table: Table, groups: Sequence[Sequence[str]] = GROUPS) -> List[str]:
    """Every system of the figure: all members of each group (``GROUPS``) that has a row
    anywhere, then systems outside the groups; each keeps its slot and legend entry."""
    present = {impl for per_n in table.values() for cells in per_n.values() for impl in cells}
    keep = _with_groups(present, groups)
    order = {impl: i for i, (impl, _, _) in enumerate(SYSTEMS)}
    # known systems in SYSTEMS order, each followed by its knob variants; then the unknown ones
    return sorted(keep, key=lambda s: (order.get(base_system(s), len(order)), s))


def panel_systems(cells: Dict[str, Cell], systems: List[str],
                  groups: Sequence[Sequence[str]] = GROUPS) -> List[str]:
    """The systems with a slot at one GPU count of a panel: every group that runs there."""
    keep = _with_groups(set(cells), groups)
    return [impl for impl in systems if impl in keep]


def _with_groups(present: set, groups: Sequence[Sequence[str]] = GROUPS) -> set:
    keep = set(present)
    for group in groups:
        if present & set(group):
            keep |= set(group)
    return keep


def _batches(cells: Iterable[Cell]) -> str:
    values = sorted({b for c in cells for b, _ in c.settings})
    if not values:
        return ""
    return f"bs {values[0]}" if len(values) == 1 else f"bs {values[0]}-{values[-1]}"


def panel_title(panel: Panel, per_n: Dict[int, Dict[str, Cell]]) -> str:
    """``BERT (CPU) · seq 256 · bs 4`` (T5: ``seq 256/128``)."""
    seq = f"seq {panel.seq}" + (f"/{panel.dec_seq}" if panel.dec_seq else "")
    batch = _batches(c for cells in per_n.values() for c in cells.values())
    return " · ".join(x for x in (model_label(panel.model), seq, batch) if x)


def model_label(name: str) -> str:
    try:
        from end2end.models import get_model_spec

        return get_model_spec(name).label
    except (ImportError, LookupError):  # no torch here, or a model not in the zoo
        return name


def system_of(row: ResultRow) -> str:
    """The bar a row belongs to: its mode, or ``"mode [knobs]"`` for a run with recipe knobs
    (``#@ knobs=``), which is a system of its own."""
    return f"{row.impl} [{row.knobs}]" if row.knobs else row.impl


def base_system(system: str) -> str:
    """``"slapo [fuse=False]"`` -> ``"slapo"``."""
    return system.split(" [", 1)[0]


def label_of(system: str) -> str:
    """Legend label: ``Slapo``, ``Slapo [fuse_bias_gelu=True]``."""
    base = base_system(system)
    return LABEL.get(base, base) + system[len(base):]


def baselines_of(system: str) -> List[str]:
    """The baselines a Slapo system (with or without knobs) is compared with (``PAIRS``)."""
    return [den for num, den in PAIRS if num == base_system(system)]


class Speedup(NamedTuple):
    """``system / baseline`` at one (panel, n): ``ratio`` of the medians, with its range."""

    panel: Panel
    n: int
    system: str
    baseline: str
    ratio: Ratio


def speedups(table: Table) -> List[Speedup]:
    """Every pair (``PAIRS``) with two throughputs in one panel, and ``best-slapo`` vs
    ``best-baseline`` (the artifact's conclusion: the best medians of each side)."""
    out = []
    for panel, per_n in table.items():
        for n in sorted(per_n):
            ok = {impl: c for impl, c in per_n[n].items() if c.thrpt}
            for num in ok:
                for den in baselines_of(num):
                    if den in ok:
                        out.append(Speedup(panel, n, num, den,
                                           ok[num].samples.ratio(ok[den].samples)))
            slapo = [c for impl, c in ok.items() if impl.startswith("slapo")]
            base = [ok[impl] for impl in BASELINES if impl in ok]
            if slapo and base:
                top = max(slapo, key=lambda c: c.thrpt)
                ref = max(base, key=lambda c: c.thrpt)
                out.append(Speedup(panel, n, "best-slapo", "best-baseline",
                                   top.samples.ratio(ref.samples)))
    return out


def format_speedups(items: Sequence[Speedup], table: Optional[Table] = None) -> str:
    """One line per speedup (median, range, "within noise"); with ``table``, the two batch
    sizes when they differ."""
    lines = []
    for panel, n, num, den, ratio in items:
        seq = f"seq {panel.seq}" + (f"/{panel.dec_seq}" if panel.dec_seq else "")
        line = (f"{model_label(panel.model)} {seq} n={n}: {label_of(num)} / "
                f"{label_of(den)} = {ratio}")
        cells = table[panel][n] if table else {}
        if num in cells and den in cells and cells[num].batch != cells[den].batch:
            line += f" (batch {cells[num].batch} vs {cells[den].batch})"
        lines.append(line)
    return "\n".join(lines)


def format_markdown(table: Table, items: Sequence[Speedup],
                    groups: Sequence[Sequence[str]] = GROUPS) -> str:
    """A Markdown table for the READMEs: one row per (workload, GPU count); samples/s per
    system as ``median (min-max)`` over the repeats (or the failure status, ``–`` not run), then
    one column per speedup pair: ``median ratio (range)``, ``~`` when within noise."""
    systems = figure_systems(table, groups)
    pairs = list(dict.fromkeys((s.system, s.baseline) for s in items
                               if s.system != "best-slapo"))
    ratio = {(s.panel, s.n, s.system, s.baseline): s.ratio for s in items}
    head = ["Model (seq, batch), n"] + [label_of(s) for s in systems] + \
        [f"{label_of(a)} / {label_of(b)}" for a, b in pairs]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for panel, per_n in table.items():
        for n in sorted(per_n):
            cells = per_n[n]
            seq = f"{panel.seq}" + (f"/{panel.dec_seq}" if panel.dec_seq else "")
            batch = _batches(cells.values()).replace("bs ", "")
            row = [f"`{panel.model}` ({seq}, {batch}), {n}"]
            for system in systems:
                cell = cells.get(system)
                row.append("–" if cell is None else _cell_text(cell))
            for a, b in pairs:
                r = ratio.get((panel, n, a, b))
                row.append("–" if r is None else
                           (f"{r.value:.2f}x" + (f" ({r.lo:.2f}-{r.hi:.2f})" if r.repeats > 1
                                                 else "") + (" ~" if r.within_noise else "")))
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _cell_text(cell: Cell) -> str:
    if cell.thrpt is None:
        return cell.status
    if len(cell.samples) < 2:
        return f"{cell.thrpt:.3g}"
    return f"{cell.thrpt:.3g} ({cell.samples.lo:.3g}-{cell.samples.hi:.3g})"
