"""Benchmark the model schedules on one CPU rank: training-step time and model FLOP/s of the
scheduled vs the unscheduled HF model (BERT, GPT-Neo), against the machine's GEMM rate measured
in the same run, and activation memory with ``ckpt_ratio=1.0`` vs ``0``.

    .venv/bin/python scripts/bench_model_schedules.py [--layers 4 --hidden 512 --seq 1024]

Model FLOPs count every Linear/Conv1D GEMM of the unscheduled model (6 x weights x tokens for
forward + backward) plus attention (12 x layers x batch x seq^2 x hidden, the usual full-matrix
count, also for causal and local layers). "of GEMM" divides the model FLOP/s by the fp32 GEMM
rate of the model's MLP shape, measured after every round of steps (median; "of best" uses the
best rate seen instead). glibc keeps freed activation buffers for reuse
(``slapo.keep_freed_memory()``, both variants alike; ``--no-keep-freed-memory`` to compare).
Activation memory is the peak resident-set growth of
one forward+backward over the state before it (Linux ``/proc/self/clear_refs``), per ckpt_ratio.
Results are printed as a table and, with ``--json PATH``, written as JSON.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any, Dict

import torch
from torch import nn

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def gemm_rate(m: int = 1024, k: int = 512, n: int = 2048, reps: int = 20) -> float:
    """Best FLOP/s of an fp32 ``[m, k] @ [k, n]`` matmul (the model's MLP shape) over ``reps``:
    the rate the machine can reach, so that load spikes do not inflate the model's fraction."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * m * k * n / min(times)


def model_flops(model: nn.Module, batch: int, seq: int, layers: int, hidden: int) -> float:
    """Training FLOPs of one step (see the module docs)."""
    weights = sum(m.weight.numel() for m in model.modules()
                  if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D")
    return 6 * weights * batch * seq + 12 * layers * batch * seq * seq * hidden


def make(family: str, args: argparse.Namespace, layers: int) -> nn.Module:
    import transformers as tf

    if family == "bert":
        config = tf.BertConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                               num_hidden_layers=layers, num_attention_heads=args.heads,
                               intermediate_size=4 * args.hidden,
                               max_position_embeddings=args.seq, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0)
        model = tf.BertForMaskedLM(config)
    else:
        config = tf.GPTNeoConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                                 num_layers=layers, num_heads=args.heads,
                                 attention_types=[[["global", "local"], layers // 2]],
                                 window_size=256, intermediate_size=4 * args.hidden,
                                 max_position_embeddings=args.seq, resid_dropout=0.0,
                                 embed_dropout=0.0, attention_dropout=0.0, use_cache=False,
                                 bos_token_id=0, eos_token_id=0)
        model = tf.GPTNeoForCausalLM(config)
    return model.train()


def inputs(args: argparse.Namespace) -> Dict[str, torch.Tensor]:
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    return {"input_ids": ids, "labels": ids.clone()}


def step_times(models: Dict[str, nn.Module], batch: Dict[str, torch.Tensor], steps: int,
               gemm_rates: list) -> Dict[str, float]:
    """Median seconds of forward + backward + SGD step per model; the models' steps are
    interleaved, so load changes on a shared machine hit every variant alike, and after each
    round the GEMM rate is measured again (appended to ``gemm_rates``)."""
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in models.items()}
    times: Dict[str, list] = {k: [] for k in models}
    for i in range(steps + 2):  # two warm-up rounds
        for k, model in models.items():
            t = time.perf_counter()
            opts[k].zero_grad(set_to_none=True)
            model(**batch).loss.backward()
            opts[k].step()
            if i >= 2:
                times[k].append(time.perf_counter() - t)
        if i >= 2:
            gemm_rates.append(gemm_rate(reps=5))
    return {k: statistics.median(v) for k, v in times.items()}


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def activation_peak(model: nn.Module, batch: Dict[str, torch.Tensor]) -> int:
    """Peak RSS growth (bytes) of one forward+backward, gradients already allocated. Run in a
    fresh process with ``MALLOC_MMAP_THRESHOLD_`` fixed, so freed activations leave the RSS."""
    model(**batch).loss.backward()  # allocate .grad once
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _rss_kib("VmRSS:")
    model(**batch).loss.backward()
    return (_rss_kib("VmHWM:") - before) * 1024


def memory_in_subprocess(args: argparse.Namespace, ratio: float) -> int:
    """:func:`activation_peak` of the ``mem_layers`` GPT-Neo at ``ratio``, in a fresh process."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="65536")
    argv = [sys.executable, __file__, "--memory-only", str(ratio)] + [
        f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
        if k not in ("json", "memory_only", "keep_freed_memory") and v is not None]
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    return int(out.strip().splitlines()[-1])


def memory_only(args: argparse.Namespace) -> None:
    from slapo.model_schedule import apply_schedule

    torch.manual_seed(0)
    model = make("gpt_neo", args, args.mem_layers)
    apply_schedule(model, "gpt_neo", ckpt_ratio=args.memory_only)
    print(activation_peak(model, inputs(args)))


def bench(args: argparse.Namespace) -> Dict[str, Any]:
    import slapo
    from slapo.model_schedule import apply_schedule

    kept = bool(args.keep_freed_memory) and slapo.keep_freed_memory()
    torch.manual_seed(0)
    rates = [gemm_rate()]
    rows = []
    for family in ("bert", "gpt_neo"):
        ref = make(family, args, args.layers)
        flops = model_flops(ref, args.batch, args.seq, args.layers, args.hidden)
        batch = inputs(args)
        models = {"hf": ref, "slapo": copy.deepcopy(ref)}
        apply_schedule(models["slapo"], family)
        for variant, t in step_times(models, batch, args.steps, rates).items():
            rows.append(dict(family=family, variant=variant, step_s=t, tflops=flops / t / 1e12))
        del models, ref
        gc.collect()
    rates.append(gemm_rate())
    # The machine's GEMM rate while the steps ran (median over the rounds; a shared machine's
    # rate drifts by 10-30% over minutes), and the best rate seen (a stricter reference).
    rate, best = statistics.median(rates), max(rates)
    for r in rows:
        r["mfu"] = r["tflops"] * 1e12 / rate
        r["of_best_gemm"] = r["tflops"] * 1e12 / best
    memory = {ratio: memory_in_subprocess(args, ratio) for ratio in (0.0, 1.0)}
    speedup = {f: next(r["step_s"] for r in rows if r["family"] == f and r["variant"] == "hf")
               / next(r["step_s"] for r in rows if r["family"] == f and r["variant"] == "slapo")
               for f in ("bert", "gpt_neo")}
    return dict(args=vars(args), gemm_tflops=rate / 1e12, best_gemm_tflops=best / 1e12,
                gemm_tflops_samples=[r / 1e12 for r in rates], rows=rows, speedup=speedup,
                activation_bytes={str(k): v for k, v in memory.items()},
                ckpt_memory_ratio=memory[1.0] / memory[0.0], threads=torch.get_num_threads(),
                keep_freed_memory=kept,
                loadavg_before=os.getloadavg(), torch=torch.__version__,
                machine=platform.processor() or platform.machine())


def main(argv: Any = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--mem-layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--no-keep-freed-memory", dest="keep_freed_memory", action="store_false",
                   help="leave glibc's malloc thresholds alone (default: slapo.keep_freed_memory"
                   "(), for both variants alike)")
    p.add_argument("--memory-only", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_only is not None:
        return memory_only(args)
    load = os.getloadavg()
    res = bench(args)
    res["loadavg_before"], res["loadavg_after"] = load, os.getloadavg()
    print(f"GEMM rate: {res['gemm_tflops'] * 1e3:.1f} GFLOP/s median of "
          f"{len(res['gemm_tflops_samples'])}, best {res['best_gemm_tflops'] * 1e3:.1f} "
          f"({res['threads']} threads); "
          f"load average before/after: {load[0]:.2f} / {res['loadavg_after'][0]:.2f}; "
          f"keep_freed_memory: {res['keep_freed_memory']}")
    print(f"{'family':8} {'variant':7} {'step s':>8} {'GFLOP/s':>9} {'of GEMM':>8} "
          f"{'of best':>8}")
    for r in res["rows"]:
        print(f"{r['family']:8} {r['variant']:7} {r['step_s']:8.3f} {r['tflops'] * 1e3:9.1f} "
              f"{r['mfu']:8.2f} {r['of_best_gemm']:8.2f}")
    print("speedup slapo/hf: " + ", ".join(f"{k} {v:.2f}x" for k, v in res["speedup"].items()))
    mem = res["activation_bytes"]
    print(f"activation peak ({args.mem_layers}-layer GPT-Neo): ckpt 0: {mem['0.0'] / 2**20:.0f} "
          f"MiB, ckpt 1.0: {mem['1.0'] / 2**20:.0f} MiB, ratio {res['ckpt_memory_ratio']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
