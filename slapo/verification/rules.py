"""Rule checks: schedule mistakes found from the schedule alone, without running the model.

``check_schedule(sch)`` returns a list of :class:`Problem` (path, what, hint):

* layout rules of tensor parallelism (``slapo.sharding.check_layouts``): a partial output that is
  never reduced, a bias added on every rank, a column-parallel region whose input gradient is
  never all-reduced, an incomplete shard;
* head projections of one attention sharded inconsistently (some of q/k/v split, others whole);
* a tied parameter whose partner was not sharded (the tie is broken);
* dropout inside a tensor-parallel region without ``fork_rng`` (every rank would drop the same
  elements of different heads).

``slapo.verify`` runs these first and refuses to run the model when any is found.
"""

from __future__ import annotations

from typing import Dict, List

from torch import nn

from ..runtime.forward_wrap import has_forward_wrapper
from ..schedule import Schedule
from ..sharding.layout import LayoutProblem, shard_info
from ..sharding.layout_check import check_layouts
from ..sharding.rules import head_rule_for
from ..sharding.spec import get_shard_spec

__all__ = ["Problem", "check_schedule"]


# One record type for every rule violation (layout rules and the checks below).
Problem = LayoutProblem


def check_schedule(sch: Schedule) -> List[Problem]:
    """Every rule violation found in the schedule tree of ``sch`` (empty list: none)."""
    root = sch.root
    problems = list(check_layouts(root))
    nodes = list(root.named_schedules())
    problems += _head_problems(nodes)
    problems += _tie_problems(root)
    problems += _dropout_problems(nodes)
    return problems


def _column_sharded(node: Schedule) -> bool:
    info = shard_info(node)
    return bool(info is not None and info.layout is not None and info.layout.input_grad_partial)


def _head_problems(nodes) -> List[Problem]:
    out = []
    for path, node in nodes:
        rule = head_rule_for(node.mod)
        if rule is None:
            continue
        projections = [n for n in rule.projections(node.mod) if n in node.child]
        split = [n for n in projections if _column_sharded(node.child[n])]
        if split and len(split) != len(projections):
            whole = [n for n in projections if n not in split]
            out.append(Problem(
                path, f"head projections {', '.join(split)} are sharded but "
                f"{', '.join(whole)} are not, so the head counts no longer match",
                "shard every head projection of the attention on its output axis"))
    return out


def _tie_problems(root: Schedule) -> List[Problem]:
    """Ties of the original model (same Parameter object at several paths) that are broken now
    with one side sharded; known ties of HF models are checked even without the original."""
    groups: List[List[str]] = []
    original = getattr(root, "original", None)
    if original is not None:
        owners: Dict[int, List[str]] = {}
        for mpath, mod in original.named_modules(remove_duplicate=False):
            for pname, p in mod.named_parameters(recurse=False):
                owners.setdefault(id(p), []).append(f"{mpath}.{pname}" if mpath else pname)
        groups = [names for names in owners.values() if len(set(names)) > 1]
    model = root.mod
    config = getattr(model, "config", None)
    if getattr(config, "tie_word_embeddings", False) and hasattr(model, "get_output_embeddings"):
        inp, outp = model.get_input_embeddings(), model.get_output_embeddings()
        if isinstance(inp, nn.Module) and isinstance(outp, nn.Module):
            paths = {id(m): n for n, m in model.named_modules()}
            if id(inp) in paths and id(outp) in paths:
                groups.append([f"{paths[id(inp)]}.weight", f"{paths[id(outp)]}.weight"])
    out = []
    for names in groups:
        tensors = [_get(model, n) for n in names]
        if any(t is None for t in tensors) or all(t is tensors[0] for t in tensors):
            continue
        sharded = [n for n, t in zip(names, tensors) if get_shard_spec(t) is not None]
        if sharded:
            out.append(Problem(
                names[0].rsplit(".", 1)[0], f"parameters {', '.join(names)} were tied but are "
                f"separate now, and only {', '.join(sharded)} is sharded",
                "shard one of them with shard(); it keeps the tie and shards both"))
    return out


def _get(model: nn.Module, name: str):
    mod_path, _, pname = name.rpartition(".")
    try:
        return getattr(model.get_submodule(mod_path), pname)
    except AttributeError:
        return None


def _dropout_problems(nodes) -> List[Problem]:
    """A module with column-parallel children (its heads are split) that applies dropout with
    p > 0 must run under fork_rng, itself or through an ancestor."""
    out = []
    for path, node in nodes:
        if not any(_column_sharded(c) for c in node.child.values()):
            continue
        rates = [c.mod.p for c in node.child.values() if isinstance(c.mod, nn.Dropout)]
        attr = getattr(node.mod, "attention_dropout", 0.0)  # HF attentions that use F.dropout
        if isinstance(attr, (int, float)):
            rates.append(float(attr))
        p = max(rates, default=0.0)
        if p <= 0:
            continue
        forked, anc = False, node
        while anc is not None and not forked:
            forked = has_forward_wrapper(anc.mod, "fork_rng")
            anc = anc.parent
        if not forked:
            out.append(Problem(
                path, f"applies dropout (p={p}) to activations split across tensor-parallel "
                "ranks but does not run under fork_rng, so every rank drops the same positions "
                "of different heads", f"call sch['{path}'].fork_rng() (after "
                "slapo.set_random_seed(seed, tp_rank=rank))"))
    return out
