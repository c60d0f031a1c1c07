"""Compare a scheduled model with the unscheduled HF model after one training step, on one rank
or on every rank of a TP group: outputs (gathered when sharded), and the gradient of every
reference parameter -- including those the schedule renamed (op-library attention and MLPs:
``query`` -> ``q_proj``, fused ``qkv_proj``, GPT-2's Conv1D ``c_attn`` ...), mapped back here."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Dict, Iterator, Tuple

import torch
from torch import nn

from slapo.model_schedule import apply_schedule
from slapo.op.mlp import MLP
from slapo.op.self_attention import SelfAttention, split_qkv
from slapo.sharding import reduce_replicated_grads
from slapo.testing import example_inputs, tiny_model
from slapo.verify_tools import to_full

TOL = dict(rtol=1e-4, atol=2e-5)

# HF attention class -> (q, k, v, out) child names and renamed extras {slapo: hf}
_HF_ATTN = {
    "BertSelfAttention": (("query", "key", "value", None), {}),
    "RobertaSelfAttention": (("query", "key", "value", None), {}),
    "AlbertAttention": (("query", "key", "value", "dense"),
                        {"layer_norm.weight": "LayerNorm.weight",
                         "layer_norm.bias": "LayerNorm.bias"}),
    "GPTNeoSelfAttention": (("q_proj", "k_proj", "v_proj", "out_proj"), {}),
    "OPTAttention": (("q_proj", "k_proj", "v_proj", "out_proj"), {}),
    "LlamaAttention": (("q_proj", "k_proj", "v_proj", "o_proj"), {}),
    "T5Attention": (("q", "k", "v", "o"),
                    {"relative_attention_bias.weight": "relative_attention_bias.weight"}),
}


def _grad_linear(mod: nn.Module, name: str) -> torch.Tensor:
    """Gradient of ``mod.<name>`` in Linear layout (HF Conv1D weights are ``[in, out]``)."""
    g = getattr(mod, name).grad
    return g.t() if type(mod).__name__ == "Conv1D" and name == "weight" else g


def _hf_attention_grads(ref: nn.Module) -> Dict[str, torch.Tensor]:
    """{"q.weight": grad, ...} of a HF attention module, in Linear layout."""
    if type(ref).__name__ == "GPT2Attention":
        w, b = _grad_linear(ref.c_attn, "weight"), ref.c_attn.bias.grad
        h = ref.embed_dim
        out = {f"{p}.weight": w[i * h:(i + 1) * h] for i, p in enumerate("qkv")}
        out.update({f"{p}.bias": b[i * h:(i + 1) * h] for i, p in enumerate("qkv")})
        out.update({"out.weight": _grad_linear(ref.c_proj, "weight"),
                    "out.bias": ref.c_proj.bias.grad})
        return out
    names, extras = _HF_ATTN[type(ref).__name__]
    out = {}
    for key, child in zip(("q", "k", "v", "out"), names):
        if child is not None:
            for t in ("weight", "bias"):
                p = getattr(getattr(ref, child), t)
                if p is not None:
                    out[f"{key}.{t}"] = p.grad
    for mine, theirs in extras.items():
        module, _, leaf = theirs.rpartition(".")
        if getattr(ref, module, None) is not None:
            out[mine] = getattr(getattr(ref, module), leaf).grad
    return out


def _full_grads(mod: nn.Module, group) -> Dict[str, torch.Tensor]:
    return {n: to_full(p.grad, group, p.grad, param=p) for n, p in mod.named_parameters()
            if p.grad is not None}


def _slapo_attention_grads(attn: SelfAttention, group) -> Dict[str, torch.Tensor]:
    full = _full_grads(attn, group)
    out = {}
    for t in ("weight", "bias"):
        if f"qkv_proj.{t}" in full:
            fused = full.pop(f"qkv_proj.{t}")
            kv_heads = fused.shape[0] // ((attn.groups + 2) * attn.head_dim)
            q, k, v = split_qkv(fused, kv_heads * attn.groups, kv_heads, attn.head_dim)
            out.update({f"q.{t}": q, f"k.{t}": k, f"v.{t}": v})
        for p in "qkv":
            if f"{p}_proj.{t}" in full:
                out[f"{p}.{t}"] = full.pop(f"{p}_proj.{t}")
        if f"out_proj.{t}" in full:
            out[f"out.{t}"] = full.pop(f"out_proj.{t}")
    out.update(full)
    return out


def renamed_pairs(ref: nn.Module, model: nn.Module, group) -> Iterator[Tuple[str, Any, Any]]:
    """(name, scheduled full grad, reference grad) for the modules the schedule replaced."""
    for path, mod in model.named_modules():
        if isinstance(mod, SelfAttention):
            want = _hf_attention_grads(ref.get_submodule(path))
            got = _slapo_attention_grads(mod, group)
            assert set(got) == set(want), (path, sorted(got), sorted(want))
            for k in want:
                yield f"{path}.{k}", got[k], want[k]
        elif isinstance(mod, MLP):
            hf, full = ref.get_submodule(path), _full_grads(mod, group)
            for mine, theirs in (("fc_in", "c_fc"), ("fc_out", "c_proj")):
                yield f"{path}.{mine}.weight", full[f"{mine}.weight"], \
                    _grad_linear(getattr(hf, theirs), "weight")
                yield f"{path}.{mine}.bias", full[f"{mine}.bias"], getattr(hf, theirs).bias.grad


def outputs_of(out: Any) -> Dict[str, torch.Tensor]:
    if dataclasses.is_dataclass(out) and not isinstance(out, dict):
        out = {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}
    if isinstance(out, torch.Tensor):
        return {"out": out}
    return {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}


def compare_training(ref: nn.Module, model: nn.Module, inputs: Dict[str, Any], *, group=None,
                     sequence_parallel: bool = False) -> int:
    """One forward/backward of both; outputs and every reference gradient must match."""
    outs = []
    for m in (ref, model):
        m.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        out = outputs_of(m(**inputs))
        out["loss"].backward()
        outs.append(out)
    if sequence_parallel:
        reduce_replicated_grads(model, group)
    for k, want in outs[0].items():
        got = to_full(outs[1][k].detach(), group, like=want)
        torch.testing.assert_close(got, want.detach(), **TOL, msg=lambda m, k=k: f"{k}: {m}")
    ref_params = dict(ref.named_parameters())
    done = set()
    for name, p in model.named_parameters():
        if name in ref_params and p.grad is not None:
            got = to_full(p.grad, group, p.grad, param=p)
            torch.testing.assert_close(got, ref_params[name].grad, **TOL,
                                       msg=lambda m, n=name: f"grad {n}: {m}")
            done.add(name)
    for name, got, want in renamed_pairs(ref, model, group):
        torch.testing.assert_close(got, want, **TOL, msg=lambda m, n=name: f"grad {n}: {m}")
        done.add(name)
    expected = {n for n, p in ref_params.items() if p.grad is not None}
    renamed = {n for n in expected - done
               if any(n.startswith(f"{path}.") for path, m in model.named_modules()
                      if isinstance(m, (SelfAttention, MLP)))}
    missing = expected - done - renamed
    assert not missing, f"gradients not compared: {sorted(missing)[:5]}"
    return len(done)


def wideresnet(seed: int = 0) -> nn.Module:
    """A tiny WideResNet in float64: train-mode BatchNorm over a batch of 2 amplifies float32
    rounding (channel-split convolutions sum in another order) beyond fp32 tolerances."""
    from end2end.wideresnet import WideResNetForImageClassification

    torch.manual_seed(seed)
    return WideResNetForImageClassification([1, 2, 1, 1], width_per_group=16,
                                            num_classes=8).double().train()


def wideresnet_inputs() -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(2, 3, 32, 32, generator=g, dtype=torch.float64),
            "labels": torch.tensor([1, 5])}


def check_family(family: str, group=None, **knobs: Any) -> int:
    """Schedule a tiny ``family`` model with ``knobs`` and compare one training step."""
    if family == "wideresnet":
        ref, inputs = wideresnet(), wideresnet_inputs()
    else:
        ref, inputs = tiny_model(family), example_inputs(family)
    model = copy.deepcopy(ref)
    apply_schedule(model, family, group=group, **knobs)
    return compare_training(ref, model, inputs, group=group,
                            sequence_parallel=knobs.get("sequence_parallel", False))
