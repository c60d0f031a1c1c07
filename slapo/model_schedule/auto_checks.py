"""What ``apply_schedule(model, "auto")`` decides before it changes anything.

The auto schedule is *plan, check, apply*: everything here reads the model and raises
``ConfigError`` (one line: the module path, what is wrong, how to fix it) or returns a
decision; nothing changes the model. :mod:`slapo.model_schedule.auto` then applies.

* :func:`vocab_modules`: the input embedding, every embedding tied to it or to the LM head
  (T5Gemma's decoder embedding is the head's weight), and the head, that become
  vocab-parallel;
* :func:`head_loss`: the loss over the vocab-sharded logits, from the head the model really
  has (the loss function its forward calls), not from the family: ``"causal"`` (shifted
  labels, HF ``ForCausalLMLoss``), ``"masked"`` (labels aligned with the logits, HF
  ``ForMaskedLMLoss``: masked LMs, and T5Gemma, whose decoder inputs are already shifted) or
  ``"gather"`` (any other loss: the logits are all-gathered and the model's own loss runs);
* :func:`check_sequence_parallel`: sequence parallelism only where each layer's dataflow is
  LLaMA's, read from the layer's ``forward`` (Gemma 2/3's sandwich norms are refused).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from torch import nn

from ..errors import ConfigError
from ..schedule import Schedule
from . import tp_plan as P

__all__ = ["vocab_modules", "head_loss", "check_sequence_parallel", "SP_NORMS", "CALL"]

CALL = "apply_schedule('auto')"
SP_NORMS = ("input_layernorm", "post_attention_layernorm")


def _path_of(sch: Schedule, mod: Optional[nn.Module]) -> Optional[str]:
    if mod is None:
        return None
    return next((path for path, m in sch.mod.named_modules() if m is mod), None)


def _tied(sch: Schedule, weight: Optional[nn.Parameter]) -> List[str]:
    """Paths of every module holding ``weight`` as its own ``weight``."""
    if weight is None:
        return []
    return [path for path, m in sch.mod.named_modules(remove_duplicate=False)
            if m._parameters.get("weight") is weight]


def vocab_modules(sch: Schedule, entries: Sequence[P.PlanEntry]
                  ) -> Tuple[List[str], Optional[str], List[str]]:
    """``(embeddings, head, whole)``: the embeddings that become vocab-parallel (the input
    embedding and every embedding tied to it or to the head; empty when one of them is not a
    plain ``nn.Embedding`` or the plan keeps it whole), the LM head (``None``: absent, not a
    plain Linear, kept whole by the plan, or tied to an embedding that stays whole) and the
    modules whose plan entries must be dropped to keep them whole (a head tied to an
    embedding that stays whole: sharding its weight would shard the embedding's)."""
    model = sch.mod
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    emb_mod = get_in() if callable(get_in) else None
    head_mod = get_out() if callable(get_out) else None
    head = _path_of(sch, head_mod) if isinstance(head_mod, nn.Module) else None
    whole = {e.path for e in entries if P.STYLES[e.style].keeps_whole and e.param is None}
    emb_paths = [p for p in _tied(sch, getattr(emb_mod, "weight", None)) if p != head]
    head_weight = getattr(head_mod, "weight", None) if head is not None else None
    tied_to_head = [p for p in _tied(sch, head_weight) if p != head]
    embs = list(dict.fromkeys([*emb_paths, *tied_to_head]))
    if any(p in whole or not P.plain_embedding(sch[p].mod) for p in embs):
        embs = []  # an embedding the plan keeps whole (or one that is not plain) stays whole
    keep: List[str] = []
    if head is not None and tied_to_head and not set(tied_to_head) <= set(embs):
        keep = [head]
        head = None
    if head is not None and (head in whole or not P.plain_linear(head_mod)):
        head = None
    return embs, head, keep


def _forward_source(mod: nn.Module) -> Optional[ast.FunctionDef]:
    try:
        fn = inspect.unwrap(type(mod).forward)
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    func = tree.body[0] if tree.body else None
    return func if isinstance(func, ast.FunctionDef) else None


def head_loss(sch: Schedule) -> str:
    """The vocab-parallel loss for the model's head: ``"causal"`` / ``"masked"`` when its
    ``forward`` calls ``self.loss_function`` and transformers resolves that to
    ``ForCausalLMLoss`` / ``ForMaskedLMLoss``; ``"gather"`` otherwise (the model's own loss
    on all-gathered logits)."""
    from transformers.loss.loss_utils import ForCausalLMLoss, ForMaskedLMLoss

    model = sch.mod
    func = _forward_source(model)
    calls = func is not None and any(
        isinstance(n, ast.Attribute) and n.attr == "loss_function"
        and isinstance(n.value, ast.Name) and n.value.id == "self" for n in ast.walk(func))
    if not calls:
        return "gather"
    fn: Any = getattr(model, "loss_function", None)
    if fn is ForCausalLMLoss:
        return "causal"
    return "masked" if fn is ForMaskedLMLoss else "gather"


def _self_call(node: ast.AST) -> Optional[str]:
    """``name`` when ``node`` is a call ``self.name(...)``."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"):
        return node.func.attr
    return None


def _producer_of(func: ast.FunctionDef, var: str, before: int) -> Optional[str]:
    """The ``self.<child>`` call whose result was last assigned to ``var`` before line
    ``before`` (``None``: anything else)."""
    last: Optional[ast.Assign] = None
    for node in ast.walk(func):
        if (isinstance(node, ast.Assign) and node.lineno < before and any(
                isinstance(t, ast.Name) and t.id == var for t in node.targets)):
            if last is None or node.lineno > last.lineno:
                last = node
    return _self_call(last.value) if last is not None else None


def _region_inputs(func: ast.FunctionDef, children: Set[str]) -> Dict[str, Optional[str]]:
    """child -> the ``self.<norm>`` call producing its input (first positional argument or
    ``hidden_states=``) in ``func``; ``None`` where it is anything else."""
    found: Dict[str, Optional[str]] = {}
    for node in ast.walk(func):
        name = _self_call(node)
        if name not in children or not isinstance(node, ast.Call):
            continue
        arg = node.args[0] if node.args else next(
            (k.value for k in node.keywords if k.arg == "hidden_states"), None)
        producer = _producer_of(func, arg.id, node.lineno) if isinstance(
            arg, ast.Name) else None
        if name in found and found[name] != producer:
            producer = None  # called twice on different inputs
        found[name] = producer
    return found


def _layer_norms(layer: nn.Module) -> Set[str]:
    return {name for name, child in layer.named_children()
            if "norm" in name.lower() or "norm" in type(child).__name__.lower()}


def check_sequence_parallel(sch: Schedule, layers: Sequence[str],
                            entries: Sequence[P.PlanEntry], final_norm: str) -> None:
    """Sequence parallelism fits layers whose dataflow is LLaMA's: each tensor-parallel
    region of a layer (attention, MLP) reads the output of one of :data:`SP_NORMS` directly,
    the layer has no other norm (Gemma 2/3's sandwich norms normalise whole-hidden activations
    between the regions), there is a final ``norm``, and the plan has only
    ``colwise``/``rowwise``/replicated entries. Changes nothing.

    Raises:
        ConfigError: naming the layer (or plan entry) and what does not fit.
    """
    plain = (P.Colwise(), P.Rowwise())
    bad = [e for e in entries
           if P.STYLES[e.style] not in plain and not P.STYLES[e.style].keeps_whole]
    if bad:
        raise _sp_error(bad[0].path, f"plan entry '{bad[0].glob}: {bad[0].style}' gathers or "
                        "splits activations")
    if not layers or final_norm not in sch:
        raise _sp_error(final_norm, "no decoder layer list and final 'norm' found")
    regions = {path for path in P.checks._regions(entries)}
    for layer in layers:
        mod = sch[layer].mod
        children = {r[len(layer) + 1:] for r in regions if r.rpartition(".")[0] == layer}
        extra = sorted(_layer_norms(mod) - set(SP_NORMS))
        if extra or not all(hasattr(mod, n) for n in SP_NORMS):
            raise _sp_error(layer, f"{type(mod).__name__} has norms {extra or 'other than'} "
                            f"{'besides ' if extra else ''}{', '.join(SP_NORMS)}")
        func = _forward_source(mod)
        inputs = _region_inputs(func, children) if func is not None else {}
        wrong = sorted(c for c in children if inputs.get(c) not in SP_NORMS)
        if not children or wrong:
            raise _sp_error(layer, f"{type(mod).__name__}.forward does not feed "
                            f"{', '.join(wrong) or 'its tensor-parallel modules'} straight "
                            f"from {' / '.join(SP_NORMS)}")


def _sp_error(path: str, why: str) -> ConfigError:
    return ConfigError(f"sequence_parallel is not supported for this model: {why}", path=path,
                       call=CALL, hint="drop sequence_parallel=True (tensor parallelism alone "
                       "works for this model)")
