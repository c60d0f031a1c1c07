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

import torch
from torch import nn

import slapo

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


def _tensors(out: Any) -> Dict[str, torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return {"out": out}
    items = out.items() if isinstance(out, dict) else (
        enumerate(out) if isinstance(out, (tuple, list)) else vars(out).items())
    return {str(k): v for k, v in items if isinstance(v, torch.Tensor)}


def _step(model: nn.Module, inputs: Dict[str, Any]) -> Tuple[dict, dict]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    out = _tensors(model(**inputs))
    loss = out["loss"] if "loss" in out else sum(v.float().sum() for v in out.values())
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in out.items()}, grads


def assert_same_step(ref: nn.Module, model: nn.Module, inputs: Dict[str, Any]) -> None:
    """One forward + backward of both under the same seed: same outputs and gradients."""
    (ref_out, ref_grads), (out, grads) = _step(ref, inputs), _step(model, inputs)
    assert ref_out.keys() == out.keys() and ref_grads.keys() == grads.keys()
    for k in ref_out:
        torch.testing.assert_close(out[k], ref_out[k], msg=lambda m, k=k: f"output {k}: {m}")
    for k in ref_grads:
        torch.testing.assert_close(grads[k], ref_grads[k], msg=lambda m, k=k: f"grad {k}: {m}")


def check_fidelity(make: Callable[[], nn.Module], schedule: Callable[[Any], None],
                   run_inputs: Any, label: str) -> List[Tuple[bool, bool, str]]:
    """For each mode to trace in, build two equal models (``make()``), schedule (trace) one
    with ``schedule(sch)`` and compare a training step of both in each mode on
    ``run_inputs``. Returns ``(traced_training, run_training, outcome)`` cells, outcome
    ``"equal"``, ``"guarded"`` or ``"refused to trace"``; a silent difference fails the test
    (:func:`assert_same_step`); a refusal must be one line."""
    cells = []
    for traced_training in (True, False):
        ref, model = make(), make()
        model.train(traced_training)
        sch = slapo.create_schedule(model)
        try:
            schedule(sch)
            model = sch.mod  # a traced root is a new module (the schedule holds it)
        except slapo.TraceError as e:  # refused when traced: clean, if one line
            assert "\n" not in str(e), f"{label}: a refusal of more than one line: {e}"
            REFUSALS.append(f"{label} traced {traced_training}: {e}")
            COUNTS["refused to trace"] += 1
            cells.append((traced_training, None, "refused to trace"))
            continue
        for run_training in (True, False):
            ref.train(run_training)
            model.train(run_training)
            try:
                assert_same_step(ref, model, run_inputs)
                outcome = "equal"
            except slapo.TraceError as e:
                text = str(e)
                assert "\n" not in text, f"{label}: a refusal of more than one line: {text}"
                REFUSALS.append(f"{label} traced {traced_training} run {run_training}: {text}")
                outcome = "guarded"
            COUNTS[outcome] += 1
            cells.append((traced_training, run_training, outcome))
    return cells
