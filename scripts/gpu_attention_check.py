#!/usr/bin/env python
"""The op library's attention kernels against eager attention on one CUDA GPU (bf16).

    python scripts/gpu_attention_check.py --out DIR [--seq 2048 --batch 4 --heads 16 --dim 128]

For each case (causal / bidirectional, with a local window for the causal one) it runs the
forward and backward of ``slapo.op.attention`` with ``backend`` = flash, efficient, cudnn and
math, and of "eager" attention (``attention_reference``: matmul, softmax, matmul, as HF's eager
modules do), in bf16; it records the median time of fwd+bwd (CUDA events), the speedup over
eager, and the largest error of the output and the query gradient against an fp32 reference.
A kernel that cannot run the case (``OpError``: e.g. flash with a window mask) is recorded as
``unsupported`` with the reason. Writes ``DIR/attention.tsv``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, List

COLUMNS = ("case", "backend", "dtype", "batch", "heads", "seq", "dim", "ms_fwd_bwd",
           "speedup_vs_eager", "max_err_out", "max_err_grad", "status", "note")


def _time_ms(fn: Callable[[], None], reps: int, device: str) -> float:
    import time

    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if device != "cuda":  # smoke test of this script off the GPU
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run_case(case: str, kwargs: Dict, args: argparse.Namespace) -> List[Dict]:
    import torch

    from slapo.errors import OpError
    from slapo.op.attention import attention, attention_reference

    dev = args.device
    g = torch.Generator(device=dev).manual_seed(0)
    shape = (args.batch, args.heads, args.seq, args.dim)
    q32, k32, v32 = (torch.randn(shape, device=dev, generator=g) for _ in range(3))
    dout = torch.randn(shape, device=dev, generator=g)

    def leaves(dtype):
        return [t.detach().to(dtype).requires_grad_() for t in (q32, k32, v32)]

    ref_q, ref_k, ref_v = leaves(torch.float32)
    ref = attention_reference(ref_q, ref_k, ref_v, **kwargs)
    ref.backward(dout)
    rows, eager_ms = [], None
    for backend in ("eager", "flash", "efficient", "cudnn", "math"):
        row = dict(case=case, backend=backend, dtype="bf16", batch=args.batch, heads=args.heads,
                   seq=args.seq, dim=args.dim, status="ok", note="")
        q, k, v = leaves(torch.bfloat16)
        d = dout.to(torch.bfloat16)

        def step(q=q, k=k, v=v, d=d, backend=backend):
            for t in (q, k, v):
                t.grad = None
            out = (attention_reference(q, k, v, **kwargs) if backend == "eager"
                   else attention(q, k, v, backend=backend, **kwargs))
            out.backward(d)
            return out

        try:
            out = step()
            row["max_err_out"] = f"{(out.float() - ref).abs().max().item():.3g}"
            row["max_err_grad"] = f"{(q.grad.float() - ref_q.grad).abs().max().item():.3g}"
            ms = _time_ms(step, args.reps, dev)
        except (OpError, RuntimeError) as exc:
            row.update(status="unsupported", note=" ".join(str(exc).split())[:160])
            rows.append(row)
            continue
        if backend == "eager":
            eager_ms = ms
        row["ms_fwd_bwd"] = f"{ms:.3f}"
        row["speedup_vs_eager"] = f"{eager_ms / ms:.2f}" if eager_ms else ""
        rows.append(row)
        print(f"{case:>18s} {backend:>9s} {ms:8.2f} ms  x{row['speedup_vs_eager'] or '-':>5s}  "
              f"err {row['max_err_out']}", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--device", default="cuda", help="cpu: a smoke test of the script only")
    args = p.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_attention_check.py: no CUDA device is available", file=sys.stderr)
        return 3
    rows = []
    for case, kwargs in (("causal", dict(causal=True)), ("bidirectional", dict(causal=False)),
                         ("causal+window", dict(causal=True, window_size=args.window))):
        rows += run_case(case, kwargs, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "attention.tsv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, COLUMNS, delimiter="\t", restval="na")
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out / 'attention.tsv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
