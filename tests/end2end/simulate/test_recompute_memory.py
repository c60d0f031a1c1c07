"""With activation checkpointing, the simulator's peak per rank (the live bytes its recorder
counts) is the real run's: a real 2-rank gloo step of ``slapo-megatron`` (TP 2) through the
driver's own code, measured by PyTorch's ``MemTracker`` (independent accounting), against the
simulated rank 0 of the same run, without and with every layer recomputed, and what the
recomputation saves. (On a CPU the resident set of such a run is well above its live bytes:
glibc keeps freed heap; that slack is the cpu profile's memory relation, not this peak:
docs/planning.md, "On this CPU, measured".)"""

from __future__ import annotations

import pytest

from end2end.simulate.engine.isolated import isolated

MODE, MODEL, SEQ, BATCH = "slapo-megatron", "tiny/bert", 64, 8
HERE = "tests.end2end.simulate.test_recompute_memory"


def _spec(ckpt: str):
    from end2end.spec.config_file import make_run_spec

    return make_run_spec(MODE, MODEL, 2, SEQ, 0, BATCH, ckpt, steps=1, warmup=0, dtype="fp32",
                         tp=2, pp=1, micro_batch=BATCH)


def _simulated_peak(ckpt: str) -> int:
    from end2end.spec.layout import run_layout
    from end2end.simulate.engine.step import simulate_rank

    spec = _spec(ckpt)
    return simulate_rank(spec, run_layout(spec), 0, gpu=False).memory["peak"]


def _real_peak(ckpt: str) -> int:
    """A steady step (one warm-up step first: Adam's states exist) under ``MemTracker``."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from end2end.driver.assemble import build_runner, rank_batch
    from end2end.spec.layout import run_layout

    from slapo.runtime.distributed import init_distributed

    spec = _spec(ckpt)
    layout, env = run_layout(spec), init_distributed()
    runner = build_runner(spec, layout, None, env.device)
    batch = rank_batch(spec, layout, env.rank, env.device, None)
    runner.train_step(batch)
    tracker = MemTracker()
    tracker.track_external(runner.model, runner.optimizer)
    with tracker:
        runner.train_step(batch)
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.fixture(scope="module")
def real() -> dict:
    from slapo.testing import run_distributed

    out = {}
    for ckpt in ("0", "1"):
        ranks = run_distributed(_real_peak, 2, ckpt)
        out[ckpt] = ranks[0] if isinstance(ranks, list) else ranks
    return out


def test_peak_with_and_without_recomputation_is_the_real_live_peak(real):
    simulated = {ckpt: isolated(f"{HERE}._simulated_peak", ckpt) for ckpt in ("0", "1")}
    for ckpt in ("0", "1"):
        error = simulated[ckpt] / real[ckpt] - 1
        print(f"ckpt {ckpt}: simulated {simulated[ckpt]} B, MemTracker {real[ckpt]} B "
              f"({error:+.2%})")
        assert abs(error) <= 0.02, (ckpt, simulated, real)
    saved = (simulated["0"] - simulated["1"]) / (real["0"] - real["1"])
    assert real["1"] < real["0"] and 0.95 <= saved <= 1.05, (simulated, real)
