#!/usr/bin/env python
"""Benchmark delayed initialisation at TP=2 on CPU (2 gloo ranks launched by this script).

    .venv/bin/python scripts/bench_delayed_init.py            # GPT-Neo-1.3B-sized, ~1 min
    .venv/bin/python scripts/bench_delayed_init.py --layers 2 # quick smoke run
    .venv/bin/python scripts/bench_delayed_init.py --partition  # pipeline cut of the meta model

Per rank it reports, for a GPT-Neo-1.3B-sized model (hidden 2048, 24 layers, 16 heads, vocab
50257 padded to 50304) built on the meta device, scheduled with the standard Megatron TP layout
and built with ``init_weights=True``:

* time to schedule (create the schedule and shard the meta model): goal < 2 s; the HF
  constructor's own time on meta is reported separately;
* time to materialise (``slapo.build``);
* peak resident memory (RSS high-water mark, reset after the imports, relative to the RSS then)
  against the rank's shard bytes: goal <= 1.5x; and against the full model's bytes.

Then the per-rank parameter bytes at TP=2 vs TP=1 for BERT-large and GPT-Neo configs (meta
models; goal <= 0.55). Results are printed as JSON lines (and as a table).

``--partition`` instead traces the meta model (``trace_until("transformer")``) and cuts it into
2 and 4 pipeline stages in one process (after a warm-up; 3 interleaved rounds, medians): time
(goal < 10 s), peak RSS over the RSS after building the meta model (goal < 0.25x the weights'
bytes), and that every parameter is still on meta.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")


# ------------------------------------------------------------------------- model configs
def gpt_neo_config(layers: int = 24):
    import transformers as tf

    return tf.GPTNeoConfig(vocab_size=50304, hidden_size=2048, num_layers=layers, num_heads=16,
                           attention_types=[[["global", "local"], layers // 2]],
                           max_position_embeddings=2048, bos_token_id=0, eos_token_id=0)


def bert_large_config(layers: int = 24):
    import transformers as tf

    return tf.BertConfig(vocab_size=30528, hidden_size=1024, num_hidden_layers=layers,
                         num_attention_heads=16, intermediate_size=4096)


def shard_gpt_neo(sch, layers: int) -> None:
    """The standard (Megatron) TP layout of GPT-Neo: vocab-parallel embedding (tied to the LM
    head), column-parallel q/k/v and c_fc, row-parallel out_proj and c_proj."""
    sch["transformer.wte"].shard("weight", axis=0)
    for i in range(layers):
        attn, mlp = f"transformer.h.{i}.attn.attention", f"transformer.h.{i}.mlp"
        for proj in ("q_proj", "k_proj", "v_proj"):
            sch[f"{attn}.{proj}"].shard("weight", axis=0)
        sch[f"{attn}.out_proj"].shard("weight", axis=1)
        sch[f"{mlp}.c_fc"].shard(["weight", "bias"], axis=0)
        sch[f"{mlp}.c_proj"].shard("weight", axis=1)


def shard_bert(sch, layers: int) -> None:
    """The standard TP layout of BERT: vocab-parallel word embedding (tied to the decoder),
    column-parallel q/k/v and intermediate, row-parallel output projections."""
    sch["bert.embeddings.word_embeddings"].shard("weight", axis=0)
    sch["cls.predictions"].shard("bias", axis=0)
    for i in range(layers):
        layer = f"bert.encoder.layer.{i}"
        for proj in ("query", "key", "value"):
            sch[f"{layer}.attention.self.{proj}"].shard(["weight", "bias"], axis=0)
        sch[f"{layer}.attention.output.dense"].shard("weight", axis=1)
        sch[f"{layer}.intermediate.dense"].shard(["weight", "bias"], axis=0)
        sch[f"{layer}.output.dense"].shard("weight", axis=1)


# ------------------------------------------------------------------------- measurements
def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (the RSS high-water mark) to the current RSS
        return True
    except OSError:
        return False


def _tensor_bytes(model) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def _full_bytes(model) -> int:
    from slapo.sharding import get_shard_spec

    total = 0
    for p in model.parameters():
        spec = get_shard_spec(p)
        numel = p.numel() * (spec.world_size if spec is not None else 1)
        total += numel * p.element_size()
    return total


def _build_meta(kind: str, layers: int, tp: bool, times: Optional[Dict] = None):
    """Build the model on meta, then schedule it; ``times`` gets both durations."""
    import slapo
    import transformers as tf

    t0 = time.perf_counter()
    with slapo.init_empty_weights():
        if kind == "gpt_neo":
            model = tf.GPTNeoForCausalLM(gpt_neo_config(layers))
        else:
            model = tf.BertForMaskedLM(bert_large_config(layers))
    t1 = time.perf_counter()
    sch = slapo.create_schedule(model)
    if tp:
        (shard_gpt_neo if kind == "gpt_neo" else shard_bert)(sch, layers)
    if times is not None:
        times["meta_model_s"] = t1 - t0
        times["schedule_s"] = time.perf_counter() - t1
    return model, sch


def rank_main(layers: int) -> Dict:
    import gc

    import torch
    import torch.distributed as dist

    import transformers as tf

    import slapo

    out: Dict = {"rank": dist.get_rank(), "tp": dist.get_world_size()}
    # One-time imports (transformers loads model modules lazily) are not scheduling time.
    _ = (tf.GPTNeoForCausalLM, tf.BertForMaskedLM)
    gc.collect()
    baseline = _rss_bytes("VmRSS")
    out["peak_reset"] = _reset_peak()
    model, sch = _build_meta("gpt_neo", layers, tp=True, times=out)
    t0 = time.perf_counter()
    model, _ = slapo.build(sch, init_weights=True, device="cpu")
    out["materialize_s"] = time.perf_counter() - t0
    peak = _rss_bytes("VmHWM") if out["peak_reset"] else None
    out["shard_bytes"] = _tensor_bytes(model)
    out["full_bytes"] = _full_bytes(model)
    out["peak_rss_delta_bytes"] = None if peak is None else peak - baseline
    out["params"] = sum(p.numel() * (slapo.sharding.get_shard_spec(p).world_size
                                     if slapo.sharding.get_shard_spec(p) else 1)
                        for p in model.parameters())
    del model, sch
    gc.collect()
    # per-rank parameter bytes, TP=2 vs TP=1 (meta models: nothing is allocated)
    ratios = {}
    for kind, n in (("bert", 24), ("gpt_neo", layers)):
        tp2, _ = _build_meta(kind, n, tp=True)
        tp1, _ = _build_meta(kind, n, tp=False)
        b2 = sum(p.numel() * p.element_size() for p in tp2.parameters())
        b1 = sum(p.numel() * p.element_size() for p in tp1.parameters())
        ratios[kind] = {"tp2_bytes": b2, "tp1_bytes": b1, "ratio": b2 / b1}
    out["param_bytes"] = ratios
    torch.distributed.barrier()
    return out


def partition_main(layers: int, stages: int, seq: int = 16) -> Dict:
    """Trace the meta GPT-Neo down to its layers and cut it into ``stages`` pipeline stages,
    in this process; time and peak RSS (over the RSS after building the meta model), and a
    check that every parameter is still on the meta device."""
    import gc

    import torch
    import transformers as tf

    import slapo
    from slapo.pipeline import build_pipeline_stages

    _ = tf.GPTNeoForCausalLM
    model, _ = _build_meta("gpt_neo", layers, tp=False)
    model.config.use_cache = False
    params = sum(p.numel() for p in model.parameters())
    gc.collect()
    baseline = _rss_bytes("VmRSS")
    reset = _reset_peak()
    ids = torch.randint(0, 50257, (1, seq))
    t0 = time.perf_counter()
    sch = slapo.create_schedule(model)
    sch.trace_until("transformer", example_inputs={"input_ids": ids, "labels": ids})
    t1 = time.perf_counter()
    per = layers // stages
    for i in range(1, stages):
        sch[f"transformer.h.{i * per - 1}"].cut_pipeline_stage()
    parts = build_pipeline_stages(sch)
    t2 = time.perf_counter()
    peak = _rss_bytes("VmHWM") if reset else None
    on_meta = all(p.is_meta for part in parts for p in part.parameters())
    return {"stages": len(parts), "params": params, "seq": seq, "load_avg_1m": os.getloadavg()[0],
            "full_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "trace_s": t1 - t0, "cut_s": t2 - t1, "total_s": t2 - t0,
            "peak_rss_delta_bytes": None if peak is None else peak - baseline,
            "all_params_on_meta": on_meta}


def report_partition(layers: int, repeats: int = 3) -> bool:
    """Warm up (one trace of a 2-layer model: transformers imports code lazily on the first
    forward), then ``repeats`` interleaved rounds of 2 and 4 stages; medians and ranges."""
    import statistics

    gb = 1 / 2**30
    partition_main(2, 2)
    runs: Dict[int, List[Dict]] = {2: [], 4: []}
    for _ in range(repeats):
        for stages in (2, 4):
            r = partition_main(layers, stages)
            print(json.dumps(r))
            runs[stages].append(r)
    ok = True
    print(f"Pipeline partition of the meta GPT-Neo ({layers} layers), one process, median "
          f"[min-max] of {repeats}:")
    for stages, rs in runs.items():
        total = [r["total_s"] for r in rs]
        peak = [r["peak_rss_delta_bytes"] or 0 for r in rs]
        full = rs[0]["full_bytes"]
        ok &= all(r["all_params_on_meta"] and r["peak_rss_delta_bytes"] is not None for r in rs)
        ok &= statistics.median(total) < 10 and max(peak) < 0.25 * full
        print(f"  {stages} stages ({rs[0]['params'] / 1e9:.2f}B params, {full * gb:.2f} GiB "
              f"fp32): trace_until + cut {statistics.median(total):.2f} s "
              f"[{min(total):.2f}-{max(total):.2f}] (cut + build stages "
              f"{statistics.median(r['cut_s'] for r in rs):.2f} s), peak RSS "
              f"+{statistics.median(peak) * gb:.3f} GiB [{min(peak) * gb:.3f}-"
              f"{max(peak) * gb:.3f}] = {max(peak) / full:.3f}x the weights at most, all "
              f"parameters on meta: {all(r['all_params_on_meta'] for r in rs)}")
    loads = [r["load_avg_1m"] for rs in runs.values() for r in rs]
    print(f"  1-minute load average during the runs: {min(loads):.1f}-{max(loads):.1f} "
          f"({os.cpu_count()} CPUs)")
    print("goals (median < 10 s, peak < 0.25x the weights, nothing materialised):",
          "met" if ok else "MISSED")
    return ok


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=24, help="GPT-Neo layers (24 = 1.3B)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--partition", action="store_true",
                        help="only measure tracing and cutting the meta model into 2 and 4 "
                        "pipeline stages (one process, ~2 min)")
    args = parser.parse_args(argv)
    if args.partition:
        return 0 if report_partition(args.layers) else 1
    from slapo.testing import run_distributed

    results = run_distributed(rank_main, 2, args.layers, timeout=args.timeout, threads=1)
    gb = 1 / 2**30
    ok = True
    for r in results:
        print(json.dumps(r))
    print(f"\nGPT-Neo ({results[0]['params'] / 1e9:.2f}B params, {args.layers} layers) at TP=2:")
    for r in results:
        peak = r["peak_rss_delta_bytes"]
        ratio = None if peak is None else peak / r["shard_bytes"]
        ok &= ratio is not None and ratio <= 1.5 and r["schedule_s"] < 2.0
        print(f"  rank {r['rank']}: meta model {r['meta_model_s']:.2f} s (HF constructor), "
              f"schedule {r['schedule_s']:.2f} s, materialise "
              f"{r['materialize_s']:.2f} s, shards {r['shard_bytes'] * gb:.2f} GiB, peak RSS "
              f"+{(peak or 0) * gb:.2f} GiB = {ratio or float('nan'):.2f}x shards "
              f"({(peak or 0) / r['full_bytes']:.2f}x the full model's "
              f"{r['full_bytes'] * gb:.2f} GiB)")
    print("Per-rank parameter bytes, TP=2 / TP=1:")
    for kind, v in results[0]["param_bytes"].items():
        ok &= v["ratio"] <= 0.55
        print(f"  {kind}: {v['tp2_bytes'] * gb:.3f} / {v['tp1_bytes'] * gb:.3f} GiB = "
              f"{v['ratio']:.3f}")
    print("goals (peak <= 1.5x shards, schedule < 2 s, ratio <= 0.55):", "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
