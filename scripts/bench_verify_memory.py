#!/usr/bin/env python
"""Peak memory of ``slapo.verify`` against one training step of the same model (gloo ranks).

    .venv/bin/python scripts/bench_verify_memory.py                       # 4 layers, ~1 min
    .venv/bin/python scripts/bench_verify_memory.py --layers 6 --grads    # fwd+bwd verify
    .venv/bin/python scripts/bench_verify_memory.py --estimate-only --layers 24

A BERT (hidden 1024, 16 heads, FFN 4096, vocab 30522; ``--layers`` layers) is built under
``slapo.init_empty_weights()`` and sharded Megatron-style on ``--world`` ranks (q/k/v and the FFN's
first linear by columns, the two output projections by rows). Each measurement runs in fresh
rank processes; per rank it reports the peak resident memory (RSS high-water mark, reset once
the meta model is built) over the RSS then:

* ``verify``: ``slapo.verify`` of the whole model (``eval_mode=True, rules=False``; forward only
  unless ``--grads``), which materialises the original and the shards itself;
* ``step``: ``slapo.build`` (materialise the shards), then one forward (``--grads``: forward and
  backward) of the scheduled model in eval mode: what training that model needs at least.

The ratio ``verify / step`` is what the docs state (docs/verify.md). ``--estimate-only`` prints
verify's own pre-run estimate for the configuration and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def bert_config(layers: int):
    from transformers import BertConfig

    return BertConfig(hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
                      intermediate_size=4096, vocab_size=30522, max_position_embeddings=512,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def shard_bert(sch, layers: int) -> None:
    """Megatron TP of every layer (column q/k/v and FFN-in, row output projections)."""
    for i in range(layers):
        p = f"bert.encoder.layer.{i}"
        for n in ("query", "key", "value"):
            sch[f"{p}.attention.self.{n}"].shard(["weight", "bias"], axis=0)
        sch[f"{p}.attention.self"].sync("bwd_post", "all_reduce")
        for row in (f"{p}.attention.output.dense", f"{p}.output.dense"):
            sch[row].shard("weight", axis=1)
            sch[row].sync("fwd_post", "all_reduce")
        sch[f"{p}.intermediate.dense"].shard(["weight", "bias"], axis=0)
        sch[f"{p}.intermediate.dense"].sync("bwd_post", "all_reduce")


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM (the RSS high-water mark) to the current RSS


def _meta_schedule(layers: int, seq: int, batch: int):
    import torch
    from transformers import BertForMaskedLM

    import slapo

    with slapo.init_empty_weights():
        model = BertForMaskedLM(bert_config(layers))
    sch = slapo.create_schedule(model, keep_original=True)  # the reference: a meta copy
    shard_bert(sch, layers)
    g = torch.Generator().manual_seed(0)
    inputs = {"input_ids": torch.randint(3, 30522, (batch, seq), generator=g),
              "attention_mask": torch.ones(batch, seq, dtype=torch.long)}
    return model, sch, inputs


def rank_main(mode: str, layers: int, seq: int, batch: int, grads: bool,
              rtol: float = None, atol: float = None) -> Dict:
    """One measurement on this rank (run by ``run_distributed``)."""
    import torch

    import slapo

    model, sch, inputs = _meta_schedule(layers, seq, batch)
    est = _estimate(sch, inputs, grads)
    if mode == "estimate":
        return est
    _reset_peak()
    base = _rss("VmRSS")
    if mode == "verify":
        report = slapo.verify(sch, inputs, eval_mode=True, rules=False, check_grads=grads,
                              rtol=rtol, atol=atol, raise_on_mismatch=False)
        ok = report.ok or report.failures()[0][:300]
    else:
        built, _ = slapo.build(sch, init_weights=True)
        built.eval()
        with torch.set_grad_enabled(grads):
            out = built(**inputs)
            if grads:
                out.logits.float().pow(2).mean().backward()
        ok = True
    return {"mode": mode, "peak_bytes": _rss("VmHWM") - base, "base_bytes": base, "ok": ok,
            **(est if mode == "verify" else {})}


def _estimate(sch, inputs, grads: bool) -> Dict:
    """verify's own pre-run estimate for this rank (GiB per part)."""
    from slapo.verification.budget import estimate_peak

    est = estimate_peak(sch.original, sch.mod, ((), inputs), whole=True, backward=grads)
    return {"estimate_bytes": est.total,
            "estimate_parts_gib": {k: round(v / 2 ** 30, 3) for k, v in est.parts.items()}}


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--grads", action="store_true", help="forward and backward (default: fwd)")
    ap.add_argument("--rtol", type=float, default=None, help="verify's (default: by dtype)")
    ap.add_argument("--atol", type=float, default=None)
    ap.add_argument("--estimate-only", action="store_true")
    args = ap.parse_args(argv)
    gib = 1 / 2 ** 30
    from slapo.testing import run_distributed

    head = {"layers": args.layers, "seq": args.seq, "batch": args.batch, "world": args.world,
            "grads": args.grads}
    if args.estimate_only:
        rows = run_distributed(rank_main, args.world, "estimate", args.layers, args.seq,
                               args.batch, args.grads, timeout=600)
        for rank, r in enumerate(rows):
            print(json.dumps({**head, "rank": rank, **r}))
        return 0
    print(json.dumps(head))
    peaks, est = {}, {}
    for mode in ("step", "verify"):  # a failed verify also reruns to localise: still measured
        rows = run_distributed(rank_main, args.world, mode, args.layers, args.seq, args.batch,
                               args.grads, args.rtol, args.atol, timeout=1800)
        for rank, r in enumerate(rows):
            print(json.dumps({"rank": rank, **r}))
        peaks[mode] = max(r["peak_bytes"] for r in rows)
        est = max(rows, key=lambda r: r.get("estimate_bytes", 0))
        if not all(r["ok"] is True for r in rows):
            print(f"{mode}: verification failed: {rows[0]['ok']}", file=sys.stderr)
    print(f"BERT {args.layers} layers, hidden 1024, seq {args.seq}, batch {args.batch}, "
          f"{args.world} ranks, {'fwd+bwd' if args.grads else 'forward only'}: peak RSS per "
          f"rank: step {peaks['step'] * gib:.2f} GiB, verify {peaks['verify'] * gib:.2f} GiB "
          f"(its estimate {est['estimate_bytes'] * gib:.2f} GiB), ratio "
          f"{peaks['verify'] / peaks['step']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
