"""``explain``: what a schedule changed, one line per changed module, unchanged subtrees folded.

::

    >>> print(slapo.explain(sch))
    BertLayer: 4 of 16 modules changed
      attention.self.query (Linear 32->16): shard weight [32, 32] -> [16, 32] on axis 0, ...

The line of a module lists: replacements (old -> new type), sharded parameters with global and
local shapes, syncs, checkpointing, forked RNG, annotations, tracing, fusion, pipeline stage, and
any other metadata a primitive recorded.
"""

from __future__ import annotations

from typing import Any, List

from torch import fx

from ..errors import describe_module
from ..runtime.forward_wrap import forward_wrappers
from ..schedule import Schedule
from ..sharding.layout import current_output
from ..sharding.spec import get_shard_spec

__all__ = ["explain", "changes_of"]

# Metadata keys rendered specially (others are rendered as "key: value").
_HANDLED = {"replace", "checkpoint", "annotate", "shard", "sync", "fork_rng",
            "slapo_local_heads"}


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _sync_text(rec: Any) -> str:
    if not hasattr(rec, "mode"):
        return f"sync {_short(rec)}"
    text = f"sync {rec.mode} {rec.op}"
    if getattr(rec, "axis", None) is not None:
        text += f" axis={rec.axis}"
    return text


def changes_of(node: Schedule) -> List[str]:
    """Human-readable changes recorded on one schedule node (empty if unchanged)."""
    meta = node.metadata
    out: List[str] = [f"replaced {r}" for r in meta.get("replace", [])]
    shards = []
    for name, t in list(node.mod.named_parameters(recurse=False)) + list(
        node.mod.named_buffers(recurse=False)
    ):
        spec = get_shard_spec(t)
        if spec is not None:
            shards.append(f"{name} {list(spec.global_shape)}->{list(spec.local_shape)} "
                          f"axis {spec.axis}" + (f" ({spec.parts} fused)" if spec.parts > 1
                                                  else ""))
    if shards:
        out.append("shard " + ", ".join(shards))
    heads = meta.get("slapo_local_heads")
    if heads:
        out.append("local " + ", ".join(f"{k}={v}" for k, v in heads.items()))
    out += [_sync_text(s) for s in meta.get("sync", [])]
    layout = current_output(node)
    if layout is not None:
        out.append(f"output {layout}")
    wrappers = forward_wrappers(node.mod)
    if meta.get("checkpoint") or "checkpoint" in wrappers:
        out.append("checkpointed")
    if meta.get("fork_rng") or "fork_rng" in wrappers:
        out.append("forked RNG")
    for key, value in meta.get("annotate", {}).items():
        out.append(f"annotate {key}={_short(value, 20)}")
    if isinstance(node.mod, fx.GraphModule) and "trace" not in meta:
        out.append("traced")
    for key, value in meta.items():
        if key not in _HANDLED and value not in (None, False, [], {}):
            out.append(f"{key}: {_short(value)}" if value is not True else key)
    return out


def explain(sch: Schedule) -> str:
    """The schedule's changes as text: a header, then one line per changed module (by path)."""
    lines: List[str] = []
    total = 0
    for path, node in sch.named_schedules():
        total += 1
        changes = changes_of(node)
        if changes:
            rel = path or "<root>"
            lines.append(f"  {rel} ({describe_module(node.mod)}): " + "; ".join(changes))
    head = (f"{type(sch.mod).__name__}" + (f" at '{sch.path}'" if sch.path else "")
            + f": {len(lines)} of {total} modules changed")
    if not lines:
        return head + " (nothing scheduled)"
    return "\n".join([head] + lines)


def _str(self: Schedule) -> str:
    return explain(self)


Schedule.__str__ = _str  # print(sch) shows what the schedule changed
