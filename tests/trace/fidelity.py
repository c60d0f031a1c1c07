"""The trace-fidelity check shared by the sweep tests (tests/trace/test_trace_fidelity.py).

A module traced in one mode must compute what the untraced module computes in *both* modes,
forward and backward, under the same RNG stream (dropout on), on inputs of another batch and
sequence length than the trace's, or refuse with a one-line :class:`~slapo.TraceError`.
:func:`check_fidelity` runs the 2 x 2 grid (traced in training / evaluation mode, run in
training / evaluation mode) and returns what each cell did; ``COUNTS`` adds them up over the
session (printed by the sweep's last test). :func:`check_drift` then changes the traced model
the way users change a model after scheduling it (another dtype, another attention
implementation, gradient checkpointing on) and compares it with the untraced model changed the
same way: equal, or a one-line refusal.
"""

from __future__ import annotations

import collections
import contextlib
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


def _cast(inputs: Dict[str, Any], dtype: torch.dtype) -> Dict[str, Any]:
    return {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in inputs.items()}


def _set_dtype(dtype: torch.dtype) -> Callable[[nn.Module], None]:
    return lambda m: m.to(dtype)


def _hf(m: nn.Module) -> nn.Module:
    """The HF model: a traced root keeps it (slapo.trace.original), with the same children
    and config; its methods (``set_attn_implementation`` ...) are called on it."""
    return m.__dict__.get("_slapo_original", m)


def _attn(impl: str) -> Callable[[nn.Module], None]:
    return lambda m: _hf(m).set_attn_implementation(impl)


# (name, change, undo, input dtype): what users change after scheduling.
CHANGES = [
    ("float64", _set_dtype(torch.float64), _set_dtype(torch.float32), torch.float64),
    ("eager attention", _attn("eager"), _attn("sdpa"), None),
    ("gradient checkpointing", lambda m: _hf(m).gradient_checkpointing_enable(),
     lambda m: _hf(m).gradient_checkpointing_disable(), None),
    ("bfloat16", _set_dtype(torch.bfloat16), _set_dtype(torch.float32), torch.bfloat16),
]


def check_drift(ref: nn.Module, model: nn.Module, run_inputs: Dict[str, Any], label: str
                ) -> List[Tuple[str, str]]:
    """``model`` (traced) and ``ref`` (untraced, same weights), both changed by each of
    :data:`CHANGES` in turn (and changed back): a training step must be equal, or the traced
    model refuses with one line (``"guarded"``); ``"n/a"`` where the untraced model does not
    support the change (no attention implementations, bfloat16 kernels missing on CPU)."""
    cells = []
    for name, change, undo, dtype in CHANGES:
        inputs = _cast(run_inputs, dtype) if dtype is not None else run_inputs
        try:
            change(ref)
            _step(ref, inputs)
        except Exception:  # noqa: BLE001 - the untraced model cannot do it either
            with contextlib.suppress(Exception):  # nothing to undo where nothing changed
                undo(ref)
            outcome = "n/a"
        else:
            try:
                change(model)
                assert_same_step(ref, model, inputs)
                outcome = "equal"
            except slapo.TraceError as e:
                assert "\n" not in str(e), f"{label}: a refusal of more than one line: {e}"
                REFUSALS.append(f"{label} after {name}: {e}")
                outcome = "guarded"
            finally:
                undo(ref)
                undo(model)
        COUNTS[f"{name}: {outcome}"] += 1
        cells.append((name, outcome))
    return cells


def check_fidelity(make: Callable[[], nn.Module], schedule: Callable[[Any], None],
                   run_inputs: Any, label: str, drift: bool = True
                   ) -> List[Tuple[bool, bool, str]]:
    """For each mode to trace in, build two equal models (``make()``), schedule (trace) one
    with ``schedule(sch)`` and compare a training step of both in each mode on
    ``run_inputs``. Returns ``(traced_training, run_training, outcome)`` cells, outcome
    ``"equal"``, ``"guarded"`` or ``"refused to trace"``; a silent difference fails the test
    (:func:`assert_same_step`); a refusal must be one line. The model traced in training
    mode then goes through :func:`check_drift` (``drift=False``: not)."""
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
        if drift and traced_training:
            ref.train()
            model.train()
            check_drift(ref, model, run_inputs, label)
    return cells
