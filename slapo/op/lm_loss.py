"""The loss of a HuggingFace masked LM or seq2seq model over vocab-sharded logits.

HF's ``BertForMaskedLM``, ``RobertaForMaskedLM`` and ``T5ForConditionalGeneration`` compute their
loss inside ``forward`` with a plain ``CrossEntropyLoss`` over the full ``[tokens, vocab]``
logits, so a vocab-parallel LM head would have to all-gather the logits (a batch x sequence x
vocabulary tensor per step) for that loss to run. :class:`VocabParallelLMLoss` is a forward
wrapper (:func:`slapo.runtime.forward_wrap.install_forward_wrapper`) on the model that takes
``labels`` out of the call, runs the model without them (T5: with ``decoder_input_ids`` built
from the labels exactly as HF does), and computes the same loss with
:func:`slapo.op.cross_entropy.vocab_parallel_cross_entropy` on the sharded logits. The output is
the model's own output type with ``loss`` first, as HF returns it; its ``logits`` are this
rank's vocabulary shard (rank order along the last axis), as for the causal LMs'
:class:`~slapo.op.cross_entropy.VocabParallelCausalLMLoss`.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional

import torch.distributed as dist
from torch import nn

from ..errors import SlapoError
from .cross_entropy import vocab_parallel_cross_entropy

__all__ = ["VocabParallelLMLoss", "LM_LOSS_KINDS"]

LM_LOSS_KINDS = ("masked", "seq2seq")


class VocabParallelLMLoss:
    """Forward wrapper ``wrapper(inner_forward, *args, **kwargs)`` computing a ``kind`` loss
    (``"masked"``: labels align with the logits; ``"seq2seq"``: labels are the decoder targets,
    shifted right into ``decoder_input_ids`` when those are not given) vocab-parallel over
    ``group``. Without ``labels`` the call is passed through unchanged."""

    def __init__(self, kind: str, group: Optional[dist.ProcessGroup] = None,
                 ignore_index: int = -100):
        if kind not in LM_LOSS_KINDS:
            raise SlapoError(f"unknown LM loss kind {kind!r}", call="VocabParallelLMLoss",
                             hint=f"use one of {', '.join(LM_LOSS_KINDS)}")
        self.kind, self.group, self.ignore_index = kind, group, ignore_index

    def __call__(self, inner: Callable, *args: Any, **kwargs: Any) -> Any:
        model = _bound_module(inner)
        sig = inspect.signature(type(model).forward)
        call = dict(sig.bind_partial(model, *args, **kwargs).arguments)
        for i, (name, param) in enumerate(sig.parameters.items()):
            if i == 0:
                call.pop(name, None)  # the module itself
            elif param.kind is inspect.Parameter.VAR_KEYWORD:
                call.update(call.pop(name, {}))  # **kwargs: its items are keywords
        labels = call.pop("labels", None)
        if labels is None:
            return inner(*args, **kwargs)
        if self.kind == "seq2seq" and call.get("decoder_input_ids") is None \
                and call.get("decoder_inputs_embeds") is None:
            call["decoder_input_ids"] = model._shift_right(labels)
        out = inner(**call)
        logits = out["logits"] if isinstance(out, dict) else out[0]
        loss = vocab_parallel_cross_entropy(logits, labels.to(logits.device), group=self.group,
                                            ignore_index=self.ignore_index)
        if isinstance(out, dict):  # a ModelOutput dataclass: rebuild it, loss first
            return type(out)(**{**dict(out), "loss": loss})
        return (loss, *out)

    def __deepcopy__(self, memo: dict) -> "VocabParallelLMLoss":
        return self  # holds only a process group handle


def _bound_module(fn: Callable) -> nn.Module:
    """The module a forward chain is bound to: ``partial(wrapper, partial(..., module))``."""
    while isinstance(fn, functools.partial) and fn.args:
        if isinstance(fn.args[0], nn.Module):
            return fn.args[0]
        fn = fn.args[0]
    raise SlapoError("VocabParallelLMLoss must be installed as a forward wrapper of the model",
                     call="VocabParallelLMLoss",
                     hint="install_forward_wrapper(model, 'lm_loss', VocabParallelLMLoss(...))")
