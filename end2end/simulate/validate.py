"""``python -m end2end.simulate.validate``: the simulator against published GPU measurements.

The set (issue 35, item 4) is ``docs/results/validation/``: ``validation.cfg`` holds one run per
line in the config grammar, each ending with ``# ID``, and ``sources.tsv`` one row per ID: the
part it belongs to (``calibration`` or ``validation``, fixed before any prediction was looked
at), the device profile, the published number and where it is, and what the project cannot
express. Each run is simulated as ``python -m end2end.simulate`` simulates it (a worker process,
:func:`end2end.simulate.engine.run.simulate_run`, ``--jobs`` at a time, each under the allocator
configuration its published run was launched with) and printed beside the published numbers:
samples/s (and tokens/s per GPU), model TFLOP/s per GPU in the project's convention (3 x forward,
no recomputation: :func:`end2end.models.flops.train_flops_per_sample`, so the two sides are
counted alike), memory where published, and whether it fits. Then the summary per part: MAPE of
throughput, the largest error, memory errors, out-of-memory agreement.

Published metrics become samples/s so: ``samples_per_s`` as is; ``tokens_per_s`` / seq;
``tokens_per_s_per_gpu`` x GPUs / seq; ``megatron_tflops_per_gpu`` by the paper's own count
(Narayanan et al. 2021: ``96 B s l h^2 (1 + s/6h + V/16lh)`` FLOPs per iteration, recomputation
included); ``oom``: no throughput, the run did not fit. Published memory is compared with the
predicted peak of live tensors plus the profile's allocator overhead (what the caching allocator
holds), in GiB; a run fits when the predicted need (the peak, the allocator's fragmentation under
the configuration the published run was launched with, ``alloc_conf``, and the reserved context:
:mod:`end2end.simulate.cost.allocator`) is within the card's memory (``card_gib`` when the card
differs from the profile, else the profile's).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import functools
import io
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from slapo.errors import ConfigError

__all__ = ["Point", "load_points", "published_samples", "compare", "summarize", "write_results",
           "read_results", "main", "DEFAULT_CFG", "DEFAULT_SOURCES", "COLUMNS"]

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CFG = ROOT / "docs/results/validation/validation.cfg"
DEFAULT_SOURCES = ROOT / "docs/results/validation/sources.tsv"
METRICS = ("samples_per_s", "tokens_per_s", "tokens_per_s_per_gpu", "megatron_tflops_per_gpu",
           "oom")
PARTS = ("calibration", "validation")
GIB = 2.0 ** 30
#: The columns of a results file (``--out``), in order.
COLUMNS = ("id", "part", "device", "run", "pub_samples_s", "pred_samples_s", "thr_err",
           "pub_tok_s_gpu", "pred_tok_s_gpu", "pub_tflops_gpu", "pred_tflops_gpu",
           "pub_mem_gib", "pred_mem_gib", "mem_err", "pub_fits", "pred_fits", "status",
           "seconds", "note")


@dataclass(frozen=True)
class Point:
    """One published measurement: its run (``spec``), the row of ``sources.tsv`` (``info``)."""

    id: str
    part: str
    device: str
    spec: Any  # end2end.spec.runspec.RunSpec
    metric: str
    value: Optional[float]
    memory_gib: Optional[float]
    fits: bool
    card_gib: Optional[float]
    info: Dict[str, str] = field(default_factory=dict, compare=False)


def _float(text: str) -> Optional[float]:
    return float(text) if text.strip() else None


def _ids(cfg: Path) -> Dict[int, str]:
    """Line number -> the ``# ID`` that ends a run line of ``cfg``."""
    out = {}
    for number, raw in enumerate(cfg.read_text().splitlines(), start=1):
        text = raw.strip()
        if text and not text.startswith("#") and "#" in text:
            out[number] = text.rsplit("#", 1)[1].strip()
    return out


def load_points(cfg: Path = DEFAULT_CFG, sources: Path = DEFAULT_SOURCES) -> List[Point]:
    """The set's points in ``cfg`` order; a line without an ID, an ID without a source row (or
    the reverse), an unknown metric or part: :class:`ConfigError` naming it."""
    from end2end.spec.config_file import expand, parse_config

    with open(sources, newline="") as f:
        rows = {r["id"]: r for r in csv.DictReader(f, delimiter="\t")}
    ids = _ids(cfg)
    points = []
    for line in parse_config(cfg):
        number = int(line.source.rsplit(":", 1)[1])
        pid = ids.get(number, "")
        if pid not in rows:
            raise ConfigError(f"{line.source}: run line without a source row ({pid or 'no # ID'})",
                              hint=f"end the line with '# ID' and add the ID to {sources.name}")
        row = rows.pop(pid)
        if row["metric"] not in METRICS or row["part"] not in PARTS:
            raise ConfigError(f"{sources.name}: {pid}: metric {row['metric']!r} / part "
                              f"{row['part']!r}", hint=f"metrics: {', '.join(METRICS)}; parts: "
                              f"{', '.join(PARTS)}")
        (spec,) = expand([line])
        points.append(Point(pid, row["part"], row["device"], spec, row["metric"],
                            _float(row["value"]), _float(row["memory_gib"]),
                            row["fits"] != "no", _float(row["card_gib"]), row))
    if rows:
        raise ConfigError(f"{sources.name}: {', '.join(rows)} not in {cfg.name}",
                          hint="give every source row its run line (or delete the row)")
    return points


def megatron_flops_per_sample(spec) -> float:
    """Narayanan et al. 2021's FLOPs of one sample with recomputation:
    ``96 s l h^2 (1 + s/6h + V/16lh)``."""
    from end2end.models import get_model_spec

    m = get_model_spec(spec.model)
    s, layers, h, v = spec.seq_len, m.layers, m.hidden, m.vocab
    return 96.0 * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def published_samples(point: Point) -> Optional[float]:
    """The published throughput as samples/s of the whole job (None for an OOM)."""
    v, spec = point.value, point.spec
    if v is None or point.metric == "oom":
        return None
    if point.metric == "samples_per_s":
        return v
    if point.metric == "tokens_per_s":
        return v / spec.seq_len
    if point.metric == "tokens_per_s_per_gpu":
        return v * spec.n / spec.seq_len
    return v * 1e12 * spec.n / megatron_flops_per_sample(spec)


def _err(pred: Optional[float], pub: Optional[float]) -> Optional[float]:
    return None if pred is None or not pub else pred / pub - 1


def compare(point: Point, values: Dict[str, Any]) -> Dict[str, Any]:
    """One results row: ``point`` beside a simulated row's fields (``simulate_run``)."""
    from end2end.models.flops import train_flops_per_sample
    from end2end.simulate.cost.profiles import get_profile

    spec, profile = point.spec, get_profile(point.device)
    flops = train_flops_per_sample(spec.model, spec.seq_len, spec.dec_seq_len)
    status, extra = values.get("status", "fail"), values.get("extra", {})
    simulated = status in ("sim", "sim-oom")
    pub = published_samples(point)
    pred = float(values["thrpt"]) if simulated else None
    peak = max((m["peak"] for m in extra.get("memory", [])), default=None) if simulated else None
    mem = peak * (1 + profile.allocator_overhead) / GIB if peak is not None else None
    card = point.card_gib * GIB if point.card_gib else profile.memory_bytes
    fits = (extra["needed_bytes"] <= card) if simulated else (False if status == "oom" else None)

    def per_gpu_tokens(samples):
        return None if samples is None else samples * spec.seq_len / spec.n

    def tflops(samples):
        return None if samples is None else samples * flops / spec.n / 1e12

    run = (f"{spec.mode} {spec.model} n={spec.n} s={spec.seq_len} b={spec.batch_size} "
           f"ckpt={spec.ckpt} {spec.dtype or 'fp32'} tp={spec.parallel_sizes[0]}")
    return dict(id=point.id, part=point.part, device=point.device, run=run,
                pub_samples_s=pub, pred_samples_s=pred, thr_err=_err(pred, pub),
                pub_tok_s_gpu=per_gpu_tokens(pub), pred_tok_s_gpu=per_gpu_tokens(pred),
                pub_tflops_gpu=tflops(pub), pred_tflops_gpu=tflops(pred),
                pub_mem_gib=point.memory_gib, pred_mem_gib=mem,
                mem_err=_err(mem, point.memory_gib), pub_fits=point.fits, pred_fits=fits,
                status=status, seconds=extra.get("simulate_seconds"),
                note=" ".join(str(values.get("error", "")).split())[:300])


def summarize(rows: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Throughput MAPE and largest error, memory errors, OOM agreement of ``rows``."""
    thr = [abs(r["thr_err"]) for r in rows if r["thr_err"] is not None and r["pub_fits"]]
    mem = [abs(r["mem_err"]) for r in rows if r["mem_err"] is not None]
    judged = [r for r in rows if r["pred_fits"] is not None]
    return dict(
        rows=len(rows), throughput_rows=len(thr),
        mape=sum(thr) / len(thr) if thr else None, max_err=max(thr, default=None),
        within_35=sum(e <= 0.35 for e in thr), memory_rows=len(mem),
        mem_max_err=max(mem, default=None),
        oom_published=sum(not r["pub_fits"] for r in rows),
        oom_agreed=sum(not r["pub_fits"] and r["pred_fits"] is False for r in judged),
        fit_published=sum(bool(r["pub_fits"]) for r in judged),
        false_oom=sum(bool(r["pub_fits"]) and r["pred_fits"] is False for r in judged),
        not_simulated=sum(r["status"] not in ("sim", "sim-oom", "oom") for r in rows))


def summary_text(rows: Sequence[Dict[str, Any]], part: str) -> str:
    """One paragraph: the summary of the ``part`` rows against the issue's goals."""
    sel = [r for r in rows if r["part"] == part]
    if not sel:
        return f"{part}: no rows."
    s = summarize(sel)

    def pct(x):
        return "-" if x is None else f"{100 * x:.0f} %"

    goals = ""
    if part == "validation":
        met = {"MAPE <= 20 %": s["mape"] is not None and s["mape"] <= 0.2,
               "every row within 35 %": s["within_35"] == s["throughput_rows"],
               "memory within 15 %": (None if not s["memory_rows"] else
                                      s["mem_max_err"] is not None and s["mem_max_err"] <= 0.15),
               "OOMs": s["oom_agreed"] == s["oom_published"] and not s["false_oom"]}
        verdict = {True: "met", False: "not met", None: "not judged (no published number)"}
        goals = " Goals (issue 35): " + "; ".join(
            f"{goal} {verdict[ok]}" for goal, ok in met.items()) + "."
    return (f"{part}: {s['rows']} rows; throughput MAPE {pct(s['mape'])}, largest error "
            f"{pct(s['max_err'])}, {s['within_35']} of {s['throughput_rows']} within 35 %; memory "
            f"largest error {pct(s['mem_max_err'])} over {s['memory_rows']} rows; published OOMs "
            f"predicted OOM: {s['oom_agreed']} of {s['oom_published']}; published runs predicted "
            f"OOM: {s['false_oom']} of {s['fit_published']}; not simulated: {s['not_simulated']}."
            + goals)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else ""
    return str(value)


def write_results(path: Path, rows: Sequence[Dict[str, Any]], header: Dict[str, str]) -> None:
    """``# key: value`` header lines, then the rows as TSV (:data:`COLUMNS`)."""
    out = io.StringIO()
    for key, value in header.items():
        out.write(f"# {key}: {value}\n")
    w = csv.writer(out, delimiter="\t", lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow([_cell(r[c]) for c in COLUMNS])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out.getvalue())


def read_results(path: Path) -> tuple:
    """(header dict, rows) of a file :func:`write_results` wrote."""
    header, body = {}, []
    for line in path.read_text().splitlines():
        if line.startswith("# "):
            key, _, value = line[2:].partition(": ")
            header[key] = value
        elif line.strip():
            body.append(line)
    rows = []
    for r in csv.DictReader(body, delimiter="\t"):
        row: Dict[str, Any] = dict(r)
        for key in COLUMNS[4:14]:
            row[key] = float(r[key]) if r[key] else None
        for key in ("pub_fits", "pred_fits"):
            row[key] = {"yes": True, "no": False}.get(r[key])
        rows.append(row)
    return header, rows


def _header(argv: Sequence[str], began: float) -> Dict[str, str]:
    import platform

    from end2end.results.environment import cpu_model, git_commit

    start = datetime.datetime.fromtimestamp(began, datetime.timezone.utc)
    end = datetime.datetime.now(datetime.timezone.utc)
    return {"command": " ".join(["python -m end2end.simulate.validate",
                                 *map(shlex.quote, argv)]),
            "date": f"{start:%Y-%m-%d %H:%M}-{end:%H:%M} UTC",
            "machine": f"{cpu_model()} ({len(__import__('os').sched_getaffinity(0))} cores), "
                       f"{platform.system()} {platform.release()}",
            "commit": git_commit(ROOT),
            "what": "predictions of the simulator beside published measurements (no GPU ran "
                    "them here)"}


def build_parser() -> argparse.ArgumentParser:
    from end2end.cli import HelpFormatter, number

    p = argparse.ArgumentParser(prog="python -m end2end.simulate.validate",
                                formatter_class=HelpFormatter,
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--cfg", type=Path, default=DEFAULT_CFG, help="the set's run lines")
    p.add_argument("--sources", type=Path, default=DEFAULT_SOURCES, help="the set's source table")
    p.add_argument("--rows", action="append", default=[], metavar="WORD",
                   help="only the points whose ID contains WORD (repeatable: any of them)")
    p.add_argument("--part", choices=("all", *PARTS), default="all", help="only this part")
    p.add_argument("--out", type=Path, default=None, help="write the rows and summary (TSV)")
    p.add_argument("--timeout", type=number(float, above=0), default=900,
                   help="seconds per simulated run")
    p.add_argument("--jobs", type=number(int, minimum=1), default=2,
                   help="points simulated at a time, one process each (rows keep the set's order)")
    return p


def _print_row(r: Dict[str, Any]) -> None:
    def pct(x):
        return "   -" if x is None else f"{100 * x:+4.0f}%"

    print(f"{r['id']:34s} {r['part'][:3]} {r['device']:10s} samples/s "
          f"{_cell(r['pub_samples_s']) or '-':>8s} -> {_cell(r['pred_samples_s']) or '-':>8s} "
          f"{pct(r['thr_err'])}  TFLOP/s/GPU {_cell(r['pub_tflops_gpu']) or '-':>6s} -> "
          f"{_cell(r['pred_tflops_gpu']) or '-':>6s}  mem GiB {_cell(r['pub_mem_gib']) or '-'} "
          f"-> {_cell(r['pred_mem_gib']) or '-'} {pct(r['mem_err'])}  fits "
          f"{_cell(r['pub_fits'])}/{_cell(r['pred_fits']) or '?'}  [{r['status']}]"
          + (f" {r['note'][:120]}" if r["note"] else ""), flush=True)


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Simulate the selected points, print each beside its published numbers, then the
    summaries; ``--out``: the results file."""
    from end2end.simulate.cost.allocator import ENV
    from end2end.simulate.cost.profiles import get_profile
    from end2end.simulate.engine.run import in_order, simulate_run

    points = [p for p in load_points(args.cfg, args.sources)
              if (args.part in ("all", p.part))
              and (not args.rows or any(w in p.id for w in args.rows))]
    if not points:
        raise ConfigError("no point selected", hint="check --rows / --part against the IDs "
                          f"of {args.sources}")
    for p in points:
        get_profile(p.device)  # an unknown profile: one line before anything runs
    began, rows = time.time(), []
    # each point's worker runs under the allocator configuration its run was launched with
    tasks = [functools.partial(simulate_run, p.spec, p.device, "", args.timeout,
                               {ENV: p.info.get("alloc_conf") or None}) for p in points]
    for p, (values, _) in zip(points, in_order(tasks, args.jobs)):
        rows.append(compare(p, values))
        _print_row(rows[-1])
    for part in PARTS:
        print(summary_text(rows, part))
    if args.out:
        write_results(args.out, rows, _header(argv, began))
        print(f"wrote {args.out}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    from end2end.cli import report_errors

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    return report_errors("end2end.simulate.validate", lambda: run(args, argv), debug=False)


if __name__ == "__main__":
    sys.exit(main())
