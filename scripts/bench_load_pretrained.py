#!/usr/bin/env python
"""Benchmark ``slapo.load_pretrained`` at TP=2 on CPU (2 gloo ranks launched by this script).

    nice -n 10 .venv/bin/python scripts/bench_load_pretrained.py              # 1.3B, a few min
    nice -n 10 .venv/bin/python scripts/bench_load_pretrained.py --layers 2   # quick smoke run

A GPT-Neo-1.3B-sized checkpoint (hidden 2048, 24 layers, 16 heads, vocab 50257; fp32, written
tensor by tensor into 2 GB safetensors shards with an index, as ``save_pretrained`` lays it out)
is loaded into the model built on the meta device with its vocabulary padded to 50304 and
scheduled with the standard Megatron TP layout (vocab-parallel embedding tied to the LM head,
column-parallel q/k/v and c_fc, row-parallel out_proj and c_proj). Per rank it reports the load
time, the bytes read, and the peak resident memory (RSS high-water mark, reset after building
the meta model, relative to the RSS then; the goal is at most 1.3x the rank's shard bytes), with
the resident file pages of the mapped checkpoint counted apart (``RssFile``: page cache that the
kernel may drop, not the process's own memory). Prints JSON lines and a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Dict, List, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from bench_delayed_init import _reset_peak, _rss_bytes, gpt_neo_config, shard_gpt_neo

VOCAB, PADDED = 50257, 50304


def _config(layers: int, vocab: int):
    """``bench_delayed_init``'s GPT-Neo-1.3B config with ``vocab`` rows."""
    config = gpt_neo_config(layers)
    config.vocab_size = vocab
    return config


def write_checkpoint(path: str, layers: int, shard_bytes: int = 2 * 10**9) -> int:
    """Random fp32 weights of the unpadded model, one tensor at a time (never the whole model
    in memory). Returns the checkpoint's bytes."""
    import torch
    import transformers as tf
    from safetensors.torch import save_file

    import slapo

    os.makedirs(path, exist_ok=True)
    config = _config(layers, VOCAB)
    with slapo.init_empty_weights():
        model = tf.GPTNeoForCausalLM(config)
    g = torch.Generator().manual_seed(0)
    names = [(n, tuple(p.shape)) for n, p in model.named_parameters()]  # tied head: once
    files: List[Dict[str, torch.Tensor]] = [{}]
    size, total, weight_map = 0, 0, {}
    for name, shape in names:
        t = torch.randn(shape, generator=g) * 0.02
        nbytes = t.numel() * 4
        if files[-1] and size + nbytes > shard_bytes:
            _flush(path, files, weight_map)
            files.append({})
            size = 0
        files[-1][name] = t
        size, total = size + nbytes, total + nbytes
    _flush(path, files, weight_map)
    count = len(files)
    renamed = {}
    for i in range(1, count + 1):
        final = f"model-{i:05d}-of-{count:05d}.safetensors"
        os.replace(os.path.join(path, f"part-{i}.safetensors"), os.path.join(path, final))
        renamed[f"part-{i}.safetensors"] = final
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": {k: renamed[v] for k, v in weight_map.items()}}, f)
    config.save_pretrained(path)
    del save_file
    return total


def _flush(path, files, weight_map) -> None:
    from safetensors.torch import save_file

    name = f"part-{len(files)}.safetensors"
    save_file(files[-1], os.path.join(path, name), metadata={"format": "pt"})
    weight_map.update({k: name for k in files[-1]})
    files[-1] = {}


def rank_main(path: str, layers: int) -> Dict:
    import gc

    import torch.distributed as dist
    import transformers as tf

    import slapo
    from slapo.weights.hub_load import last_read_bytes

    with slapo.init_empty_weights():
        model = tf.GPTNeoForCausalLM(_config(layers, PADDED))
    sch = slapo.create_schedule(model)
    shard_gpt_neo(sch, layers)
    gc.collect()
    out: Dict = {"rank": dist.get_rank(), "peak_reset": _reset_peak()}
    base = _rss_bytes("VmRSS")
    t0 = time.perf_counter()
    slapo.load_pretrained(sch, path)
    out["load_s"] = round(time.perf_counter() - t0, 2)
    peak = _rss_bytes("VmHWM")
    out["rss_file_after"] = _rss_bytes("RssFile")
    seen, shard = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            shard += t.numel() * t.element_size()
    out.update(shard_bytes=shard, read_bytes=last_read_bytes(), rss_before=base,
               peak_rss=peak, peak_over_base=peak - base,
               ratio=round((peak - base) / shard, 3))
    head = model.lm_head.weight
    out["padded_rows_zero"] = bool((head[VOCAB - PADDED:] == 0).all()) if out["rank"] == 1 \
        else None
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--dir", default=None, help="where to write the checkpoint (default: a "
                   "temporary directory, removed after)")
    args = p.parse_args(argv)
    import shutil

    from slapo.testing import run_distributed

    path = args.dir or tempfile.mkdtemp(prefix="slapo-hub-bench-")
    try:
        t0 = time.perf_counter()
        total = write_checkpoint(path, args.layers)
        print(json.dumps({"checkpoint_bytes": total,
                          "write_s": round(time.perf_counter() - t0, 1)}), flush=True)
        results = run_distributed(rank_main, 2, path, args.layers, timeout=3000)
    finally:
        if args.dir is None:
            shutil.rmtree(path, ignore_errors=True)
    ok = True
    for r in results:
        print(json.dumps(r), flush=True)
        ok &= r["ratio"] <= 1.3
    print(f"summary: load {max(r['load_s'] for r in results)} s, peak RSS over the rank's "
          f"shard bytes {max(r['ratio'] for r in results)}x (goal <= 1.3x): "
          f"{'ok' if ok else 'over'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
