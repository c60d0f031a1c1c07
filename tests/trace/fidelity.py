"""The trace-fidelity check shared by the sweep tests (tests/trace/test_trace_fidelity.py).

A module traced in one mode must compute what the untraced module computes in *both* modes,
forward and backward, under the same RNG stream (dropout on), on inputs of another batch and
sequence length than the trace's, or refuse with a one-line :class:`~slapo.TraceError`.
:func:`check_fidelity` runs the 2 x 2 grid (traced in training / evaluation mode, run in
training / evaluation mode) and returns what each cell did; ``COUNTS`` adds them up over the
session (printed by the sweep's last test).
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Dict, List, Tuple

from torch import nn

import slapo
from slapo.testing import assert_same_training

COUNTS: Dict[str, int] = collections.Counter()
REFUSALS: List[str] = []

_DROPOUT = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout_prob",
            "resid_pdrop", "embd_pdrop", "attn_pdrop", "resid_dropout", "embed_dropout",
            "attention_dropout", "dropout", "activation_dropout", "dropout_rate",
            "hidden_dropout", "mlp_dropout", "residual_dropout", "embedding_dropout")


def dropout_overrides(config: Any, p: float = 0.1) -> Dict[str, float]:
    """Every dropout probability ``config`` has, set to ``p`` (the tiny models turn them off)."""
    return {k: p for k in _DROPOUT
            if isinstance(getattr(config, k, None), float)}


def check_fidelity(make: Callable[[], nn.Module], schedule: Callable[[Any], None],
                   run_inputs: Any, label: str) -> List[Tuple[bool, bool, str]]:
    """For each mode to trace in, build two equal models (``make()``), schedule (trace) one
    with ``schedule(sch)`` and compare a training step of both in each mode on
    ``run_inputs``. Returns ``(traced_training, run_training, "equal" | "guarded")`` cells;
    a silent difference fails the test (assertion from ``assert_same_training``); a refusal
    must be one line."""
    cells = []
    for traced_training in (True, False):
        ref, model = make(), make()
        model.train(traced_training)
        schedule(slapo.create_schedule(model))
        for run_training in (True, False):
            ref.train(run_training)
            model.train(run_training)
            try:
                assert_same_training(ref, model, run_inputs)
                outcome = "equal"
            except slapo.TraceError as e:
                text = str(e)
                assert "\n" not in text, f"{label}: a refusal of more than one line: {text}"
                REFUSALS.append(f"{label} traced {traced_training} run {run_training}: {text}")
                outcome = "guarded"
            COUNTS[outcome] += 1
            cells.append((traced_training, run_training, outcome))
    return cells
