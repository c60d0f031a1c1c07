"""``python -m end2end.simulate.explain CONFIG --only WORD ... [--calibration FILE] [--repeat R]
[--out DIR]``: where the ``cpu`` time model is right and wrong for one line, op group by op group.

For each selected line of the config it

* runs the real training step, as the sweep does (``torchrun --standalone --nproc_per_node n
  -m end2end.bench ... --profile DIR``: the driver, its timed steps, then one more step under
  ``torch.profiler`` on every rank; :mod:`end2end.driver.profiling`), ``R`` times, and reads
  rank 0's self time per op and the timed steps' median wall time;
* simulates the same line's first rank
(:func:`~end2end.simulate.engine.microbatches.simulate_role`, in
  a process of its own) and times every recorded op, collective and modelled runtime cost with
  the ``cpu`` profile (:mod:`end2end.simulate.cost.cpu_model`, :mod:`end2end.simulate.cost.timing`);
* prints per op group (:data:`GROUPS`: GEMMs, convolutions, attention, softmax and masking,
  dropout, norms, copies, views, other elementwise, communication, autograd and runtime hooks,
  and "outside ATen": the step's wall time not covered by any profiled op) the measured and
  predicted seconds per step, their shares of the step, the calls, and predicted / measured,
  then the ``--top`` op names by measured time with both sides.

The profiler adds a few microseconds per op, and the machine may be shared: compare shares and
ratios within one run, and repeat (``--repeat``). The measured side is rank 0 of the real run;
the predicted side is the simulator's rank 0 (same role).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["GROUPS", "group_of", "measured_groups", "predicted_groups", "explain_table",
           "measure_line", "predict_line", "main"]

#: op group -> ATen op names (without ``aten::``) in it; names not listed are ``elementwise``
#: (ATen) or ``hooks`` (anything else the profiler records: autograd nodes, Python autograd
#: functions, record_function ranges, runtimes' modelled costs)
GROUPS: Dict[str, Tuple[str, ...]] = {
    "gemm": ("mm", "addmm", "_addmm_activation", "bmm", "baddbmm", "matmul", "linear"),
    "conv": ("convolution", "_convolution", "convolution_backward", "mkldnn_convolution",
             "conv2d", "_nnpack_spatial_convolution", "_slow_conv2d_forward",
             "_slow_conv2d_backward", "mkldnn_convolution_backward"),
    "attention": ("_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_flash_attention_for_cpu_backward",
                  "scaled_dot_product_attention", "_scaled_dot_product_attention_math"),
    "softmax/mask": ("_softmax", "_softmax_backward_data", "softmax", "_log_softmax",
                     "_log_softmax_backward_data", "log_softmax", "where", "masked_fill",
                     "masked_fill_", "isneginf", "nll_loss_forward", "nll_loss_backward",
                     "cross_entropy_loss", "nll_loss", "nll_loss_nd"),
    "dropout": ("native_dropout", "native_dropout_backward", "bernoulli_", "dropout",
                "empty_like", "rand", "uniform_", "feature_dropout"),
    "norm": ("native_layer_norm", "native_layer_norm_backward", "layer_norm",
             "native_batch_norm", "native_batch_norm_backward", "batch_norm",
             "_batch_norm_impl_index", "_batch_norm_impl_index_backward",
             "_native_batch_norm_legit", "_native_batch_norm_legit_functional"),
    "copy/cat": ("copy_", "cat", "clone", "contiguous", "_to_copy", "to", "stack",
                 "embedding", "embedding_backward", "embedding_dense_backward", "index_select",
                 "zero_", "fill_", "empty", "zeros", "ones", "new_zeros", "new_empty",
                 "empty_strided", "flatten_dense_tensors", "unflatten_dense_tensors",
                 "resize_", "set_"),
    "views": ("view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand",
              "slice", "select", "unsqueeze", "squeeze", "as_strided", "split",
              "split_with_sizes", "chunk", "narrow", "alias", "detach", "unbind",
              "_reshape_alias", "view_as", "flatten", "unflatten", "lift_fresh", "numpy_T",
              "expand_as", "unfold", "diagonal", "_local_scalar_dense", "item", "is_nonzero",
              "resolve_conj", "resolve_neg"),
}
ORDER = list(GROUPS) + ["elementwise", "communication", "hooks", "outside ATen"]
_BY_NAME = {name: g for g, names in GROUPS.items() for name in names}


def group_of(key: str) -> str:
    """The op group (:data:`ORDER`) of a profiler key (``aten::mm``, ``c10d::allreduce_``,
    ``AddmmBackward0``) or of a recorded op name (``mm``; ``zero3.*``: a modelled runtime
    cost)."""
    if key.startswith(("c10d::", "gloo:", "record_param_comms", "nccl:")):
        return "communication"
    name = key[len("aten::"):] if key.startswith("aten::") else key
    if name in _BY_NAME:
        return _BY_NAME[name]
    if key.startswith("aten::") or name.startswith("_foreach_"):
        return "elementwise"
    if "::" in key or key.startswith("zero3.") or key[:1].isupper():
        return "hooks"  # autograd nodes, Python functions, ranges, modelled runtime costs
    return "elementwise"  # a recorded ATen op's name


def _empty() -> Dict[str, Dict[str, float]]:
    return {g: dict(seconds=0.0, calls=0.0, overhead=0.0) for g in ORDER}


def measured_groups(ops: Dict[str, dict], wall: float) -> Dict[str, Dict[str, float]]:
    """Seconds and calls per group of a profile's ``ops`` (``{key: {cpu_us, count}}``, self
    times) in a step of ``wall`` seconds; ``outside ATen`` = wall minus all self times."""
    out = _empty()
    for key, v in ops.items():
        g = out[group_of(key)]
        g["seconds"] += v["cpu_us"] / 1e6
        g["calls"] += v["count"]
    covered = sum(g["seconds"] for g in out.values())
    out["outside ATen"]["seconds"] = wall - covered
    return out


def predicted_groups(result, profile, ranks_on_node: int) -> Dict[str, Dict[str, float]]:
    """Seconds, calls and per-op cost (``overhead``) per group of a simulated rank's step
    (``result``: :class:`~end2end.simulate.engine.step.RankResult`) on ``profile``; communication as
    the time model charges it (exposed and hidden)."""
    from end2end.simulate.cost.timing import collective_seconds

    model = profile.eager.for_ranks(ranks_on_node, profile.memory_bandwidth)
    out = _empty()
    for op in result.ops:
        g = out[group_of(op.name)]
        t = model.op_time(op) * op.weight
        g["seconds"] += t
        g["calls"] += 0 if op.name == "zero3.byte" else op.weight  # its weight counts bytes
        fixed = (model.view_seconds.get(op.phase, 0.0) if op.view
                 else model.fixed_seconds(op))
        g["overhead"] += min(fixed * op.weight, t)
    comm = out["communication"]
    for c in result.collectives:
        comm["seconds"] += collective_seconds(c, profile) * c.weight
        comm["calls"] += c.weight
    return out


def explain_table(label: str, measured: List[Dict[str, Dict[str, float]]],
                  predicted: Dict[str, Dict[str, float]], walls: Sequence[float],
                  predicted_step: float) -> str:
    """The per-group table of one line (medians over the measured repeats)."""
    med = {g: {k: statistics.median(m[g][k] for m in measured) for k in ("seconds", "calls")}
           for g in ORDER}
    wall = statistics.median(walls)
    lines = [f"## {label}", "",
             f"measured step {wall:.3f} s (timed steps, median of {len(walls)} run(s): "
             + ", ".join(f"{w:.3f}" for w in walls) + f"); predicted step {predicted_step:.3f} s"
             f" (predicted / measured {predicted_step / wall:.2f})", "",
             "| group | measured s | share | calls | predicted s | share | ops | of which "
             "per-op cost | predicted / measured |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    p_total = sum(v["seconds"] for v in predicted.values()) or 1.0
    for g in ORDER:
        m, p = med[g], predicted[g]
        if not m["seconds"] and not p["seconds"]:
            continue
        ratio = f"{p['seconds'] / m['seconds']:.2f}" if m["seconds"] > 1e-6 else "-"
        lines.append(f"| {g} | {m['seconds']:.4f} | {m['seconds'] / wall:.0%} | "
                     f"{m['calls']:.0f} | {p['seconds']:.4f} | {p['seconds'] / p_total:.0%} | "
                     f"{p['calls']:.0f} | {p['overhead']:.4f} | {ratio} |")
    return "\n".join(lines) + "\n"


def top_ops(measured_ops: Dict[str, dict], result, profile, ranks_on_node: int,
            top: int) -> str:
    """The ``top`` op names by measured self time: measured and predicted seconds and calls."""
    model = profile.eager.for_ranks(ranks_on_node, profile.memory_bandwidth)
    pred: Dict[str, List[float]] = {}
    for op in result.ops:
        v = pred.setdefault(op.name, [0.0, 0.0])
        v[0] += model.op_time(op) * op.weight
        v[1] += op.weight
    keys = sorted(measured_ops, key=lambda k: -measured_ops[k]["cpu_us"])[:top]
    lines = ["| op | measured s | calls | predicted s | ops |", "|---|---:|---:|---:|---:|"]
    for key in keys:
        name = key[len("aten::"):] if key.startswith("aten::") else key
        p = pred.get(name, [0.0, 0.0])
        lines.append(f"| {key} | {measured_ops[key]['cpu_us'] / 1e6:.4f} | "
                     f"{measured_ops[key]['count']} | {p[0]:.4f} | {p[1]:.0f} |")
    return "\n".join(lines) + "\n"


def measure_line(spec, out_dir: Path, timeout: float = 900) -> Tuple[Dict[str, dict], float]:
    """Run ``spec`` for real with ``--profile`` (module docstring): rank 0's ops (self time,
    calls) of the profiled step and the median wall time of the timed steps."""
    from end2end.driver.profiling import load_profile

    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "measured.tsv"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={spec.n}", "-m", "end2end.bench", *spec.cli_args(),
           "--results", str(results), "--profile", str(out_dir)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)
    twin = results.with_suffix(".jsonl")
    rows = [r for r in map(json.loads, filter(str.strip, twin.read_text().splitlines()))
            if "Status" in r] \
        if twin.exists() else []
    profiles = sorted(out_dir.glob("*.rank0.json"), key=lambda p: p.stat().st_mtime)
    if not rows or rows[-1].get("Status") != "ok" or not profiles:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"the real run failed: {' '.join(cmd)}\n" + "\n".join(tail))
    times = rows[-1].get("extra", {}).get("step_times") or [rows[-1]["StepTime"]]
    return load_profile(str(profiles[-1]))["ops"], statistics.median(times)


def predict_line(spec, profile):
    """The simulator's first rank of ``spec`` (in a process of its own) and the predicted step
    (seconds, as the row's ``step_time``)."""
    from end2end.spec.layout import run_layout
    from end2end.simulate.engine.microbatches import simulate_role
    from end2end.simulate.engine.run import _values

    layout = run_layout(spec)
    result = simulate_role(spec, layout, 0, False, isolate=True)
    return result, _values(spec, layout, [result], profile)["step_time"]


def build_parser() -> argparse.ArgumentParser:
    from end2end.cli import HelpFormatter

    p = argparse.ArgumentParser(prog="python -m end2end.simulate.explain",
                                formatter_class=HelpFormatter, description=__doc__)
    p.add_argument("config", help="a CPU benchmark config (e.g. end2end/configs/cpu.cfg)")
    p.add_argument("--only", action="append", default=[], metavar="WORD", required=True,
                   help="explain the runs whose label contains every WORD (repeatable)")
    p.add_argument("--calibration", default="", help="the cpu profile's calibration file "
                   "(default: ~/.cache/slapo/cpu_profile.json)")
    p.add_argument("--repeat", type=int, default=1, help="real runs per line (medians)")
    p.add_argument("--top", type=int, default=15, help="op names listed by measured time")
    p.add_argument("--out", default="", help="directory of the profiles (default: a "
                   "temporary one) and explain.md")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    from end2end.cli import configure_logging, report_errors

    args = build_parser().parse_args(argv)
    configure_logging()
    return report_errors("end2end.simulate.explain", lambda: _explain(args), debug=False)


def _explain(args: argparse.Namespace) -> int:
    from slapo.errors import ConfigError

    from end2end.simulate.__main__ import select_runs
    from end2end.simulate.calibration.cpu import device_profile

    runs = select_runs(args.config, args.only, 64)
    if not runs:
        raise ConfigError(f"no line of {args.config} matches --only {' '.join(args.only)}",
                          call="end2end.simulate.explain",
                          hint="--only takes words of a run's label, e.g. --only deepspeed "
                               "--only cpu/bert")
    profile = device_profile("cpu", args.calibration or None)
    out = Path(args.out or tempfile.mkdtemp(prefix="slapo-explain-"))
    text = []
    for spec in runs:
        on_node = min(spec.n, profile.gpus_per_node)
        result, step = predict_line(spec, profile)
        predicted = predicted_groups(result, profile, on_node)
        measured, walls, last_ops = [], [], {}
        for i in range(args.repeat):
            last_ops, wall = measure_line(spec, out / f"{_safe(spec.label)}.{i}")
            measured.append(measured_groups(last_ops, wall))
            walls.append(wall)
        text.append(explain_table(f"{spec.label} n={spec.n}", measured, predicted, walls, step)
                    + "\n" + top_ops(last_ops, result, profile, on_node, args.top))
        print(text[-1], flush=True)
    (out / "explain.md").write_text("\n".join(text))
    print(f"written: {out / 'explain.md'}")
    return 0


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in ".=-" else "_" for c in label)


if __name__ == "__main__":
    sys.exit(main())
