"""Measure the eager-PyTorch model of this CPU
(:class:`~end2end.simulate.cost.cpu_model.EagerCpuModel`)
for each thread count the simulator needs (1, and every core for 1-rank runs).

Every quantity is counted as the simulator counts it: each measured call runs once under the
simulator's own recorder (:class:`~end2end.simulate.engine.recorder.StepRecorder`), which gives its
FLOPs, bytes and recorded ops, and is then timed without it (the median over repeated calls
after a warm-up). What each number means (all per thread count):

* ``dispatch``: seconds of one direct ATen call on 1-element tensors (no autograd): subtracted
  from every kernel timing below, since the per-op cost is charged separately.
* ``gemm[dtype][kind]``: FLOP/s over FLOPs per call. ``mm``: square GEMMs of 64-2048 and
  transformer-like ones (tokens 256-4096 x hidden 512 / FFN 2048), each in the three layouts a
  linear layer runs (``x @ w``, ``x @ w.T`` forward, ``x.T @ g`` for the weight's gradient);
  ``bmm``: attention's batched products (batch 8, sequence 64-2048, head size 64, both
  ``q @ k.T`` and ``p @ v`` shapes); ``conv``: 3x3 and 1x1 convolutions of a ResNet bottleneck
  (batch 8, 64-512 channels, 8-32 pixels), forward and backward; ``attention``: the CPU's fused
  SDPA (batch 2, 8 heads, sequence 128-2048, head size 64, causal or not), forward and
  backward. Points whose FLOPs fall in one power of two are merged (median rate). bf16: ``mm``
  only (the configs train in fp32; other kinds fall back to fp32's curves).
* ``bandwidth``: bytes/s of ``add`` over the bytes it moves (inputs + outputs), 2^14-2^24
  elements (the largest, 64 MiB tensors, above glibc's 32 MiB mmap threshold: their output
  pages are faulted in on every call, as in a training step).
* ``slowdown[op]``: for softmax, dropout (``native_dropout``, and ``bernoulli_``: the random
  numbers of eager dropout on a CPU), layer and batch norm, GELU, tanh, ReLU, ``where``,
  ``masked_fill``, log-softmax, sums, copies and their backward ops, at 2^21 elements: the op's
  seconds over an ``add``'s moving the same bytes.
* ``op_seconds[phase]``: a chain of 200 tiny ops (``tanh`` and ``mul`` on 64 elements) with
  autograd: forward seconds / recorded forward ops, backward seconds / recorded backward ops;
  ``optimizer``: one ``torch.optim.AdamW`` step over 64 tiny parameters / its recorded ops.
* ``view_seconds[phase]``: a chain of 200 views (``t``, ``unsqueeze``, ``squeeze``) with
  autograd: (seconds - the chain's other ops at ``op_seconds``) / recorded views. This decides
  whether views cost anything in eager mode: they are charged what they measure.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Sequence, Tuple

import torch

from end2end.simulate.cost.cpu_model import (SLOWDOWN_ELEMENTS, Curve, EagerCpuModel,
                                             ThreadModel)

__all__ = ["measure_eager", "MM_SHAPES", "QUICK"]

aten = torch.ops.aten

MM_SHAPES = [(s, s, s) for s in (64, 128, 256, 512, 1024, 2048)] + \
    [(t, h, f) for t in (256, 1024, 4096) for h, f in ((512, 512), (512, 2048), (2048, 512))]
BMM_SEQS = (64, 128, 256, 512, 1024, 2048)
CONVS = [(64, 64, 32, 3), (128, 128, 16, 3), (256, 256, 8, 3), (512, 512, 8, 3),
         (256, 64, 32, 1), (64, 256, 32, 1), (1024, 256, 8, 1)]  # (c_in, c_out, pixels, k)
ATTENTION_SEQS = (128, 512, 2048)
ELEMENTS = tuple(2 ** p for p in range(14, 25, 2))
CHAIN = 200
# a reduced set for tests (seconds, not a calibration)
QUICK = dict(mm=[(64, 64, 64), (256, 256, 256)], bmm=(64,), convs=[(64, 64, 8, 3)],
             attention=(128,), elements=(2 ** 14, 2 ** 16), slowdown=2 ** 14, chain=20,
             budget=0.01)


def _seconds(fn: Callable[[], object], budget: float) -> float:
    """Median seconds of one call of ``fn`` (one warm-up call, then at least 3 calls and about
    ``budget`` seconds)."""
    fn()
    times: List[float] = []
    end = time.perf_counter() + budget
    while len(times) < 3 or time.perf_counter() < end:
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _recorded(fn: Callable[[], object]):
    """The simulator's records of one call of ``fn``."""
    from end2end.simulate.engine.recorder import StepRecorder

    with StepRecorder() as rec:
        fn()
    return rec.ops


def _kernel(fn, budget: float, dispatch: float) -> Tuple[int, int, float]:
    """(FLOPs, bytes, seconds of the kernel: the call's median minus one dispatch) of ``fn``,
    whose recorded ops (not views) are summed."""
    ops = [op for op in _recorded(fn) if not op.view]
    t = _seconds(fn, budget)
    return (sum(op.flops for op in ops), sum(op.bytes for op in ops),
            max(t - dispatch * len(ops), 0.05 * t))


def _binned(points: Sequence[Tuple[float, float]]) -> Tuple[Tuple[float, float], ...]:
    """(FLOPs, FLOP/s) points merged per power of two of FLOPs: (geometric mean, median)."""
    import math

    bins: Dict[int, List[Tuple[float, float]]] = {}
    for flops, rate in points:
        bins.setdefault(round(math.log2(flops)), []).append((flops, rate))
    return tuple((math.exp(statistics.fmean(math.log(f) for f, _ in pts)),
                  statistics.median(r for _, r in pts)) for _, pts in sorted(bins.items()))


def _mm_cases(shapes, dtype) -> List[Callable[[], object]]:
    cases = []
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        w, at = torch.randn(n, k, dtype=dtype), torch.randn(k, m, dtype=dtype)
        cases += [lambda a=a, b=b: aten.mm(a, b), lambda a=a, w=w: aten.mm(a, w.t()),
                  lambda at=at, b=b: aten.mm(at.t(), b)]
    return cases


def _bmm_cases(seqs) -> List[Callable[[], object]]:
    cases = []
    for s in seqs:
        q, kt = torch.randn(8, s, 64), torch.randn(8, 64, s)
        p = torch.randn(8, s, s)
        cases += [lambda q=q, kt=kt: aten.bmm(q, kt), lambda p=p, q=q: aten.bmm(p, q)]
    return cases


def _conv_cases(convs) -> List[Callable[[], object]]:
    cases = []
    for c_in, c_out, px, k in convs:
        x, w = torch.randn(8, c_in, px, px), torch.randn(c_out, c_in, k, k)
        g = torch.randn(8, c_out, px, px)
        args = ([1, 1], [k // 2, k // 2], [1, 1], False, [0, 0], 1)
        cases += [lambda x=x, w=w, args=args: aten.convolution(x, w, None, *args),
                  lambda g=g, x=x, w=w, args=args: aten.convolution_backward(
                      g, x, w, None, *args, [True, True, False])]
    return cases


def _attention_cases(seqs) -> List[Callable[[], object]]:
    cases = []
    for s in seqs:
        q, k, v = (torch.randn(2, 8, s, 64) for _ in range(3))
        for causal in (False, True):
            out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
            cases += [lambda q=q, k=k, v=v, c=causal:
                      aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, c),
                      lambda q=q, k=k, v=v, o=out, lse=lse, c=causal:
                      aten._scaled_dot_product_flash_attention_for_cpu_backward(
                          torch.ones_like(o), q, k, v, o, lse, 0.0, c)]
    return cases


def _gemm_curves(sizes: dict, budget: float, dispatch: float) -> Dict[str, Dict[str, Curve]]:
    kinds = dict(mm=_mm_cases(sizes["mm"], torch.float32), bmm=_bmm_cases(sizes["bmm"]),
                 conv=_conv_cases(sizes["convs"]), attention=_attention_cases(sizes["attention"]))
    out: Dict[str, Dict[str, Curve]] = {"float32": {}, "bfloat16": {}}
    for kind, cases in kinds.items():
        points = []
        for fn in cases:
            flops, _, t = _kernel(fn, budget, dispatch)
            points.append((flops, flops / t))
        out["float32"][kind] = Curve(_binned(points))
    bf16 = [_kernel(fn, budget, dispatch) for fn in
            _mm_cases([s for s in sizes["mm"] if max(s) <= 1024], torch.bfloat16)]
    out["bfloat16"]["mm"] = Curve(_binned([(f, f / t) for f, _, t in bf16]))
    return out


def _elementwise_cases(n: int) -> Dict[str, Callable[[], object]]:
    """One call of each measured elementwise op on ``n`` fp32 elements (rows of 512)."""
    shape = (max(n // 512, 1), min(n, 512))
    a, b, g = (torch.randn(shape) for _ in range(3))
    # a causal mask's pattern (what models mask with), not random bits
    mask = torch.arange(shape[1]) > (torch.arange(shape[0]) % shape[1])[:, None]
    w, bias = torch.ones(shape[1]), torch.zeros(shape[1])
    soft, logsoft, th = aten._softmax(a, -1, False), aten._log_softmax(a, -1, False), a.tanh()
    _, mean, rstd = aten.native_layer_norm(a, [shape[1]], w, bias, 1e-5)
    _, keep = aten.native_dropout(a, 0.1, True)
    noise = torch.empty(shape)
    image = a.reshape(8, 64, -1, 1) if n >= 512 else a.reshape(1, 1, -1, 1)  # N C H W
    ones, zeros = torch.ones(image.shape[1]), torch.zeros(image.shape[1])
    _, bn_mean, bn_rstd = aten.native_batch_norm(image, ones, zeros, None, None, True, 0.1,
                                                 1e-5)
    f32 = torch.float32
    return {
        "add": lambda: aten.add.Tensor(a, b), "mul": lambda: aten.mul.Tensor(a, b),
        "clone": lambda: aten.clone(a), "div": lambda: aten.div.Tensor(a, b),
        "_softmax": lambda: aten._softmax(a, -1, False),
        "_softmax_backward_data": lambda: aten._softmax_backward_data(g, soft, -1, f32),
        "_log_softmax": lambda: aten._log_softmax(a, -1, False),
        "_log_softmax_backward_data":
            lambda: aten._log_softmax_backward_data(g, logsoft, -1, f32),
        "native_dropout": lambda: aten.native_dropout(a, 0.1, True),
        # eager dropout on a CPU: ``empty_like(x).bernoulli_(1 - p)``, then ``div_``, ``mul``;
        # drawing the random numbers is the slow part (one thread on this machine)
        "bernoulli_": lambda: aten.bernoulli_.float(noise, 0.9),
        "native_dropout_backward": lambda: aten.native_dropout_backward(g, keep, 1 / 0.9),
        "where": lambda: aten.where.self(mask, a, b),
        "masked_fill": lambda: aten.masked_fill.Scalar(a, mask, 0.0),
        "gelu": lambda: aten.gelu(a), "gelu_backward": lambda: aten.gelu_backward(g, a),
        "tanh": lambda: aten.tanh(a), "tanh_backward": lambda: aten.tanh_backward(g, th),
        "relu": lambda: aten.relu(a), "threshold_backward":
            lambda: aten.threshold_backward(g, a, 0.0),
        "native_layer_norm": lambda: aten.native_layer_norm(a, [shape[1]], w, bias, 1e-5),
        "native_layer_norm_backward": lambda: aten.native_layer_norm_backward(
            g, a, [shape[1]], mean, rstd, w, bias, [True, True, True]),
        "sum": lambda: aten.sum.dim_IntList(a, [0]),
        "native_batch_norm": lambda: aten.native_batch_norm(image, ones, zeros, None, None,
                                                            True, 0.1, 1e-5),
        "native_batch_norm_backward": lambda: aten.native_batch_norm_backward(
            image, image, ones, None, None, bn_mean, bn_rstd, True, 1e-5, [True, True, True]),
    }


def _bandwidth(sizes: dict, budget: float, dispatch: float) -> Tuple[Curve, Dict[str, float]]:
    points = []
    for n in sizes["elements"]:
        _, moved, t = _kernel(_elementwise_cases(n)["add"], budget, dispatch)
        points.append((moved, moved / t))
    curve = Curve(tuple(points))
    slowdown = {}
    for name, fn in _elementwise_cases(sizes["slowdown"]).items():
        _, moved, t = _kernel(fn, budget, dispatch)
        slowdown[name] = max(t / (moved / curve(moved)), 0.25)
    return curve, slowdown


def _chain_seconds(step: Callable[[torch.Tensor, int], torch.Tensor], x0: torch.Tensor,
                   length: int, budget: float):
    """(forward, backward seconds; recorded ops per phase, views apart) of ``length`` steps."""
    def forward():
        x = x0
        for i in range(length):
            x = step(x, i)
        return x.sum()

    def both():
        forward().backward()

    ops = _recorded(both)
    counts = {(op.phase, op.view): 0 for op in ops}
    for op in ops:
        counts[op.phase, op.view] += 1
    fwd = _seconds(forward, budget)
    return fwd, max(_seconds(both, budget) - fwd, 0.0), counts


def _op_costs(chain: int, budget: float) -> Tuple[Dict[str, float], Dict[str, float]]:
    scale = torch.full((64,), 1.001)
    fwd, bwd, n = _chain_seconds(lambda x, i: torch.tanh(x) if i % 2 else x * scale,
                                 torch.randn(64, requires_grad=True), chain, budget)
    ops = dict(forward=fwd / max(n.get(("forward", False), 1), 1),
               backward=bwd / max(n.get(("backward", False), 1), 1))
    views = [lambda x: x.t(), lambda x: x.unsqueeze(0), lambda x: x.squeeze(0)]
    vf, vb, vn = _chain_seconds(lambda x, i: views[i % 3](x), torch.randn(8, 8, requires_grad=True),
                                chain, budget)
    view = {phase: max(t - vn.get((phase, False), 0) * ops[phase], 0.0)
            / max(vn.get((phase, True), 1), 1) for phase, t in (("forward", vf), ("backward", vb))}
    params = [torch.nn.Parameter(torch.randn(64)) for _ in range(64)]
    for p in params:
        p.grad = torch.randn(64)
    opt = torch.optim.AdamW(params, lr=1e-3)
    n_opt = sum(1 for op in _recorded(opt.step) if not op.view)
    ops["optimizer"] = _seconds(opt.step, budget) / max(n_opt, 1)
    view["optimizer"] = view["forward"]
    return ops, view


def _dispatch_seconds(budget: float) -> float:
    one = torch.ones(1)
    return _seconds(lambda: aten.add.Tensor(one, one), budget)


def measure_threads(threads: int, quick: bool = False) -> ThreadModel:
    """The :class:`ThreadModel` of ``threads`` threads (module docstring; ``quick``: a few
    small shapes, for tests)."""
    sizes = QUICK if quick else dict(mm=MM_SHAPES, bmm=BMM_SEQS, convs=CONVS,
                                     attention=ATTENTION_SEQS, elements=ELEMENTS,
                                     slowdown=SLOWDOWN_ELEMENTS, chain=CHAIN, budget=0.1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            dispatch = _dispatch_seconds(sizes["budget"])
            gemm = _gemm_curves(sizes, sizes["budget"], dispatch)
            bandwidth, slowdown = _bandwidth(sizes, sizes["budget"], dispatch)
        ops, views = _op_costs(sizes["chain"], sizes["budget"])
    finally:
        torch.set_num_threads(before)
    return ThreadModel(threads, gemm, bandwidth, slowdown, ops, views)


def measure_eager(quick: bool = False) -> EagerCpuModel:
    """The eager model for 1 thread and for every core (``torch.get_num_threads()`` of this
    process, as a 1-rank run has), with glibc keeping freed memory as the driver has it on CPU
    (``slapo.keep_freed_memory()``: buffers up to 32 MiB are reused, larger ones are mapped and
    page-faulted afresh on every allocation, in the driver as here)."""
    import slapo

    slapo.keep_freed_memory()
    cores = torch.get_num_threads()
    counts = sorted({1, cores})
    return EagerCpuModel(cores, {t: measure_threads(t, quick) for t in counts})

