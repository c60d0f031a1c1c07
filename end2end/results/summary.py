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
do not pair up: when the two bars' ranges overlap). A bar with a repeat measured while the
machine was busy (the row's ``Machine`` column, :mod:`end2end.sweep.quiet`) and every ratio
that uses it are marked ``!`` in the tables (:data:`BUSY_MARK`, :data:`BUSY_NOTE`).
Everything here comes from the rows; nothing is a constant. Which system a row is, and its
label, colour and baselines, come from :mod:`end2end.results.systems` (re-exported here). The
rows are aggregated as a pandas DataFrame (:func:`end2end.results.stats.to_frame`): grouped into
settings and bars, the best bars of each side picked per panel, the Markdown table pivoted from
the cells.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import pandas as pd

from slapo.errors import ConfigError

from end2end.results.stats import Ratio, Samples, to_frame
from end2end.results.store import SIMULATED_STATUSES, ResultRow
from end2end.results.systems import (BASELINES, COLOR, GROUPS, LABEL, PAIRS, SYSTEMS,
                                     base_system, baselines_of, is_slapo_system, label_of,
                                     model_label, system_of)
from end2end.spec.modes import PEER_GROUPS

__all__ = ["SYSTEMS", "GROUPS", "PEER_GROUPS", "PAIRS", "BASELINES", "LABEL", "COLOR",
           "PlotError", "Panel", "Cell", "Speedup", "system_of", "base_system", "label_of",
           "baselines_of", "is_slapo_system", "figure7_table", "is_predicted", "figure_systems",
           "panel_systems", "panel_title", "speedups", "format_speedups", "format_markdown",
           "ratio_text", "BUSY_MARK", "BUSY_NOTE", "busy_note"]

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
    busy: int = 0  # repeats of the bar's setting measured while the machine was busy


Table = Dict[Panel, Dict[int, Dict[str, Cell]]]  # panel -> n -> impl -> cell


def _failure(statuses: Sequence[str]) -> str:
    return "oom" if "oom" in statuses else statuses[0]  # oom: the most informative


BAR = ["Model", "Seq", "DecSeq", "nGPU", "System"]  # the rows of one bar: (panel, n, system)
SETTING = ["Batch", "Ckpt"]  # one (batch, ckpt) setting of a bar


def figure7_table(rows: Iterable[ResultRow], best: bool = False) -> Table:
    """Aggregate rows per (panel, n, impl) into a :class:`Cell` (see the module docstring).
    Rows of one (panel, n, impl) at different (batch, ckpt) settings raise :class:`PlotError`
    unless ``best``."""
    rows = list(rows)
    _check_not_mixed(rows)
    frame = to_frame(rows).assign(System=[system_of(r) for r in rows])
    table: Table = {}
    for (model, seq, dec_seq, n, impl), bar in _setting_frame(frame).groupby(BAR, sort=False):
        panel = Panel(model, int(seq), int(dec_seq))
        settings = tuple(sorted(zip(bar.Batch.tolist(), bar.Ckpt.tolist())))
        if len(settings) > 1 and not best:
            shown = " and ".join(f"batch {b} ckpt {c}" for b, c in settings)
            raise PlotError(f"{label_of(impl)} {panel.model} seq {panel.seq} n={n} has "
                            f"rows at {shown}: one bar cannot show both",
                            hint="plot one setting (--models, or separate results files), or "
                                 "pass --best to take each system's best setting as the "
                                 "paper's Figure 7 does")
        table.setdefault(panel, {}).setdefault(int(n), {})[impl] = _bar_cell(bar, settings)
    return table


def is_predicted(rows: Iterable[ResultRow]) -> bool:
    """The rows are simulated (``python -m end2end.simulate``: status ``sim``/``sim-oom``, or a
    ``fail`` row on a ``(simulated)`` device): their figures are predictions."""
    rows = list(rows)
    return bool(rows) and all(_simulated(r) for r in rows)


def _simulated(row: ResultRow) -> bool:
    return row.status in SIMULATED_STATUSES or row.device.endswith("(simulated)")


def _check_not_mixed(rows: Sequence[ResultRow]) -> None:
    """Simulated and measured rows never share a table (so never a bar or a speedup)."""
    kinds = {_simulated(r) for r in rows}
    if len(kinds) > 1:
        raise PlotError("the rows mix simulated (predicted) and measured runs",
                        hint="plot simulated rows (python -m end2end.simulate) and measured "
                             "ones separately; a speedup never pairs a prediction with a "
                             "measurement")


def _setting_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (bar, setting), in the order the rows first show them: ``Rows``, the
    ``Failed`` repeats (not ok) and their ``Status`` (:func:`_failure`), the ``Thrpt`` median of
    the ok repeats (NaN: none) and their ``Samples`` — one value per repeat, the max where a
    repeat index appears twice (e.g. a run appended to two files)."""
    keys = BAR + SETTING
    ok = frame.Status.isin(("ok", "sim")) & frame.Thrpt.notna()  # sim: a predicted bar
    busy = frame.Machine.str.startswith("busy")
    out = frame.assign(Failed=~ok, Busy=busy).groupby(keys, sort=False).agg(
        Rows=("Status", "size"), Failed=("Failed", "sum"), Busy=("Busy", "sum"))
    out["Status"] = frame[~ok].groupby(keys, sort=False).Status.agg(
        lambda s: _failure(s.tolist()))
    rounds = frame[ok].groupby(keys + ["Repeat"], sort=False).Thrpt.max()
    by_setting = rounds.groupby(level=keys, sort=False)
    out["Thrpt"] = by_setting.median()
    out["Samples"] = pd.Series({key: Samples.of(zip(s.index.get_level_values("Repeat"), s))
                                for key, s in by_setting}, dtype=object)
    return out.reset_index()


def _bar_cell(bar: pd.DataFrame, settings: Tuple[Tuple[int, str], ...]) -> Cell:
    """The cell of one bar from its settings' rows (:func:`_setting_frame`): the setting with
    the best median (the first of equals); when none has one, the first setting with the
    failure status of them all (:func:`_failure`)."""
    chosen = bar.loc[bar.Thrpt.fillna(-math.inf).idxmax()]
    count, batch, failed = int(bar.Rows.sum()), int(chosen.Batch), int(chosen.Failed)
    if pd.isna(chosen.Thrpt):
        return Cell(None, _failure(bar.Status.tolist()), count, batch, settings, failed=failed)
    return Cell(float(chosen.Thrpt), "ok", count, batch, settings, chosen.Samples, failed,
                int(chosen.Busy))


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


class Speedup(NamedTuple):
    """``system / baseline`` at one (panel, n): the :class:`Ratio` (median of the per-round
    ratios, or of the medians), with its range."""

    panel: Panel
    n: int
    system: str
    baseline: str
    ratio: Ratio


def speedups(table: Table) -> List[Speedup]:
    """Every pair (``PAIRS``) with two throughputs in one panel, and ``best-slapo`` vs
    ``best-baseline`` (the artifact's conclusion: the bars with the best medians of each side,
    the first of equals); per panel and GPU count, pairs in the order of the table's bars."""
    bars = _bars_frame(table)
    bars = bars[bars.Thrpt > 0]
    if bars.empty:
        return []
    found = pd.concat([_pair_frame(bars).assign(Best=0), _best_frame(bars).assign(Best=1)])
    found = found.sort_values(["PanelNo", "n", "Best"], kind="stable")
    panels = list(table)
    return [Speedup(panels[p], int(n), num, den, cell.samples.ratio(base.samples))
            for p, n, num, den, cell, base in found[["PanelNo", "n", "System", "Baseline",
                                                      "Cell", "BaseCell"]].itertuples(False)]


def _bars_frame(table: Table) -> pd.DataFrame:
    """One row per bar: ``PanelNo`` (the panel's place in ``table``), ``n`` (ascending within
    a panel), ``System``, ``Thrpt`` (NaN: no throughput) and the :class:`Cell`."""
    records = [(p, n, system, cell.thrpt, cell) for p, per_n in enumerate(table.values())
               for n in sorted(per_n) for system, cell in per_n[n].items()]
    return pd.DataFrame(records, columns=["PanelNo", "n", "System", "Thrpt", "Cell"]).astype(
        {"PanelNo": "int64", "n": "int64", "System": "str", "Thrpt": "float64"})


def _with_base(found: pd.DataFrame, bars: pd.DataFrame, on: List[str]) -> pd.DataFrame:
    """``found`` with the ``BaseCell`` of its baseline bar (a row without one is dropped)."""
    base = bars.rename(columns={"System": "Baseline", "Cell": "BaseCell"})
    return found.merge(base[on + ["BaseCell"]], on=on)  # inner: keeps the order of ``found``


def _pair_frame(bars: pd.DataFrame) -> pd.DataFrame:
    """Each Slapo bar with each of its baselines (``PAIRS``) that has a bar beside it."""
    wanted = bars.assign(Baseline=bars.System.map(baselines_of)).explode("Baseline")
    return _with_base(wanted.dropna(subset=["Baseline"]), bars, ["PanelNo", "n", "Baseline"])


def _best_frame(bars: pd.DataFrame) -> pd.DataFrame:
    """Per panel and n: the best Slapo bar against the best baseline bar (``BASELINES``)."""
    where = ["PanelNo", "n"]
    slapo = bars[bars.System.map(is_slapo_system)]
    base = bars[bars.System.isin(BASELINES)]
    base = base.iloc[base.System.map(BASELINES.index).argsort(kind="stable")]  # ties: in order
    top = slapo.loc[slapo.groupby(where).Thrpt.idxmax()]
    ref = base.loc[base.groupby(where).Thrpt.idxmax()]
    return _with_base(top.assign(System="best-slapo"), ref, where).assign(
        Baseline="best-baseline")


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
    head = ["Model (seq, batch), n"] + [label_of(s) for s in systems] + \
        [f"{label_of(a)} / {label_of(b)}" for a, b in pairs]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    texts = _markdown_cells(table, items, systems, pairs)
    if texts.empty:
        return "\n".join(lines)
    grid = texts.pivot(index=["PanelNo", "n", "Row"], columns="Column", values="Text")
    grid = grid.reindex(columns=range(len(head) - 1), fill_value="–").fillna("–")  # not run
    for (_, _, row), cells in grid.iterrows():
        lines.append("| " + " | ".join([row] + cells.tolist()) + " |")
    return "\n".join(lines)


def _markdown_cells(table: Table, items: Sequence[Speedup], systems: List[str],
                    pairs: List[Tuple[str, str]]) -> pd.DataFrame:
    """The cells of :func:`format_markdown`'s rows, long: ``PanelNo``, ``n``, ``Row`` (the row's
    label), ``Column`` (systems, then pairs) and ``Text``."""
    column = {system: i for i, system in enumerate(systems)}
    column.update({pair: len(systems) + i for i, pair in enumerate(pairs)})
    place = {panel: p for p, panel in enumerate(table)}
    rows = {}
    for panel, per_n in table.items():
        for n, cells in per_n.items():
            seq = f"{panel.seq}" + (f"/{panel.dec_seq}" if panel.dec_seq else "")
            batch = _batches(cells.values()).replace("bs ", "")
            rows[panel, n] = f"`{panel.model}` ({seq}, {batch}), {n}"
    records = [(place[panel], n, rows[panel, n], column[system], _cell_text(cell))
               for panel, per_n in table.items() for n, cells in per_n.items()
               for system, cell in cells.items()]
    records += [(place[s.panel], s.n, rows[s.panel, s.n], column[s.system, s.baseline],
                 ratio_text(s.ratio) + _busy_mark(table[s.panel][s.n], s.system, s.baseline))
                for s in items
                if (s.system, s.baseline) in column and (s.panel, s.n) in rows]
    texts = pd.DataFrame(records, columns=["PanelNo", "n", "Row", "Column", "Text"])
    return texts.drop_duplicates(["PanelNo", "n", "Column"], keep="last")


def ratio_text(ratio: Ratio) -> str:
    """``1.45x (1.17-1.50) ~``: the range with repeats, ``~`` when within noise."""
    text = f"{ratio.value:.2f}x"
    if ratio.repeats > 1:
        text += f" ({ratio.lo:.2f}-{ratio.hi:.2f})"
    return text + (" ~" if ratio.within_noise else "")


def _cell_text(cell: Cell) -> str:
    if cell.thrpt is None:
        return cell.status
    mark = BUSY_MARK if cell.busy else ""
    if len(cell.samples) < 2:
        return f"{cell.thrpt:.3g}{mark}"
    return f"{cell.thrpt:.3g} ({cell.samples.lo:.3g}-{cell.samples.hi:.3g}){mark}"


BUSY_MARK = " !"
BUSY_NOTE = ("`!`: a round of this bar (or of either side of this ratio) was measured while the "
             "machine was busy (the rows' `Machine` column); re-measure it on a quiet machine "
             "(`python -m end2end.sweep --require-quiet`).")


def _busy_mark(cells: Dict[str, Cell], *systems: str) -> str:
    """``BUSY_MARK`` when a bar of ``systems`` at one (panel, n) had a busy round."""
    return BUSY_MARK if any(cells[s].busy for s in systems if s in cells) else ""


def busy_note(table: Table) -> str:
    """:data:`BUSY_NOTE` when a bar of ``table`` had a busy round, else ``""``."""
    busy = any(c.busy for per_n in table.values() for cells in per_n.values()
               for c in cells.values())
    return BUSY_NOTE if busy else ""
