"""What verify holds: outputs compared a chunk at a time, no autograd graph for a forward-only
run, module outputs recorded only after a mismatch (and then only the original's), and a
pre-run estimate that stops an over-large run with a one-line error on every rank."""

import pytest
import torch
import torch.distributed as dist

import slapo
from slapo import VerifyError
from slapo.testing import example_inputs, run_distributed, tiny_model
from slapo.verification import budget, tools, verify as verify_mod

GELU = "bert.encoder.layer.1.intermediate.intermediate_act_fn"


def test_compare_in_chunks_is_the_whole_comparison(monkeypatch):
    g = torch.Generator().manual_seed(0)
    b = torch.randn(5, 13, generator=g)
    a = b.clone()
    a[4, 12] += 1e-3  # in the last chunk
    whole = tools.compare(a, b, 1e-4, 1e-5)
    monkeypatch.setattr(tools, "_CHUNK", 7)
    chunked = tools.compare(a, b, 1e-4, 1e-5)
    assert not chunked.ok and not whole.ok
    assert chunked.max_abs == pytest.approx(whole.max_abs)
    assert chunked.max_rel == pytest.approx(whole.max_rel)
    assert tools.compare(b.clone(), b, 1e-4, 1e-5).ok
    c, d = b.clone(), b.clone()
    c[3, 3] = d[3, 3] = float("inf")
    assert tools.compare(c, d, 1e-4, 1e-5).ok  # the same non-finite places
    c[0, 1] = float("nan")
    assert tools.compare(c, d, 1e-4, 1e-5).note == "NaN/inf in different places"


def _count_records(monkeypatch):
    counts = {"kept": 0, "outputs_with_graph": 0}
    record = tools.OutputRecorder.record

    def counting(self, records, path, n, t):
        if type(self) is tools.OutputRecorder:
            counts["kept"] += 1
        record(self, records, path, n, t)

    call = verify_mod._call

    def watching(model, inputs):
        out = call(model, inputs)
        counts["outputs_with_graph"] += tools.first_tensor(out).grad_fn is not None
        return out

    monkeypatch.setattr(tools.OutputRecorder, "record", counting)
    monkeypatch.setattr(verify_mod, "_call", watching)
    return counts


def test_passing_forward_only_verify_holds_no_records_and_no_graph(monkeypatch):
    counts = _count_records(monkeypatch)
    model = tiny_model("bert")
    sch = slapo.create_schedule(model, keep_original=True)
    sch["bert.encoder.layer.0"].checkpoint()
    report = slapo.verify(sch, example_inputs("bert"), check_grads=False)
    assert report.ok and report.outputs
    assert counts == {"kept": 0, "outputs_with_graph": 0}


def test_a_mismatch_is_localised_by_a_rerun_holding_the_originals_records(monkeypatch):
    counts = _count_records(monkeypatch)
    model = tiny_model("bert")
    sch = slapo.create_schedule(model, keep_original=True)
    sch[GELU].replace(torch.nn.GELU(approximate="tanh"))
    report = slapo.verify(sch, example_inputs("bert"), dtype=torch.float64,
                          raise_on_mismatch=False)
    assert not report.ok and report.first_divergence[0] == GELU
    assert report.first_grad_divergence is not None
    # the original's outputs and output gradients only; the scheduled model's are compared
    # as they are produced
    modules = len(list(model.named_modules(remove_duplicate=False)))
    assert 0 < counts["kept"] <= 2 * modules
    # forward only: the rerun localises too, without a graph
    counts["outputs_with_graph"] = 0
    report = slapo.verify(sch, example_inputs("bert"), dtype=torch.float64, check_grads=False,
                          raise_on_mismatch=False)
    assert report.first_divergence[0] == GELU and counts["outputs_with_graph"] == 0


class _Memory:
    def __init__(self, available):
        self.available = available


def test_the_estimate_counts_the_weights_and_stops_an_over_large_run(monkeypatch):
    model = tiny_model("bert")
    sch = slapo.create_schedule(model, keep_original=True)
    inputs = example_inputs("bert")
    tensors = list(model.parameters()) + list(model.buffers())
    weights = sum(t.numel() * t.element_size() for t in tensors)
    floats = sum(t.numel() * t.element_size() for t in tensors if t.is_floating_point())
    fwd = budget.estimate_peak(sch.original, model, ((), inputs), whole=True, backward=False)
    assert fwd.parts["original"] == fwd.parts["scheduled"] == fwd.parts["restore copy"] == weights
    assert fwd.parts["gradients"] == 0 and fwd.parts["activations"] > 0
    assert fwd.parts["allocator margin"] == (fwd.total - fwd.parts["allocator margin"]) // 4
    both = budget.estimate_peak(sch.original, model, ((), inputs), whole=True, backward=True,
                                dtype=torch.float64)
    assert both.parts["original"] == weights + floats  # float64: twice the float tensors
    assert both.parts["gradients"] == 2 * (weights + floats)
    assert both.parts["activations"] > 2 * fwd.parts["activations"]
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: _Memory(fwd.total // 2))
    with pytest.raises(VerifyError) as e:
        slapo.verify(sch, inputs, check_grads=False)
    text = str(e.value)
    assert "\n" not in text
    assert f"verify would need about {fwd.total / 2 ** 30:.1f} GiB" in text
    assert "only 0.0 GiB are available" in text
    assert "Hint: lower it with check_grads=False and steps=1 (forward only)" in text
    assert "float32 instead of dtype=torch.float64" in text
    assert slapo.verify(sch, inputs, check_grads=False, check_memory=False).ok


def _estimate_on_ranks():
    """Forward-only verify of a TP=2 BERT passes; when only rank 1 lacks memory, every rank
    stops with the same error (no rank is left waiting in a collective)."""
    import psutil

    from tests.verification.test_fault_injection import bert_tp

    model = tiny_model("bert")
    sch = slapo.create_schedule(model, keep_original=True)
    bert_tp(sch)
    inputs = example_inputs("bert")
    assert slapo.verify(sch, inputs, check_grads=False).ok
    if dist.get_rank() == 1:
        psutil.virtual_memory = lambda: _Memory(1000)
    try:
        slapo.verify(sch, inputs, check_grads=False)
    except VerifyError as e:
        return str(e).split(" GiB")[0]
    return "no error"


def test_every_rank_stops_when_one_lacks_memory():
    first, second = run_distributed(_estimate_on_ranks, 2)
    assert first == second and "verify would need about" in first
