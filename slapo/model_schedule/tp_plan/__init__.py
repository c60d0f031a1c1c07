"""A HuggingFace model's own tensor-parallel plan as Slapo primitives.

transformers 5 models declare how they shard: the config class's ``base_model_tp_plan`` (globs
relative to the base model, e.g. ``layers.*.self_attn.q_proj: colwise``) and the model class's
``_tp_plan`` (relative to the model, e.g. ``lm_head: colwise_gather_output``). This package

* reads the plan and resolves it against the model's real module and parameter paths
  (:mod:`.plan`: :func:`read_plan` adds the base-model prefix, :func:`resolve_plan` expands
  each ``*`` as one path part into :class:`PlanEntry` rows);
* knows what each style means (:mod:`.styles`): one small parameterised class per style
  (:class:`Colwise` ``(gather_output=, packed=)``, :class:`Rowwise` ``(split_input=,
  packed=)``, :class:`Embedding` ``(axis=)``, ...), and :data:`STYLES` mapping each HF style
  string Slapo honours to an instance;
* checks the plan (:mod:`.checks`): a style Slapo cannot honour is *refused* with a
  ``ConfigError`` naming the entry (glob and style) and why (:data:`REFUSED`); an unknown
  style is an error too; head counts the TP size does not divide; parameters the plan does not
  name inside a tensor-parallel region;
* refuses a plan whose entries match nothing under a layer list it would leave mostly whole
  (:mod:`.coverage`: :func:`check_coverage`; a renamed attention or MLP inside the layers);
* applies it (:mod:`.apply`: :func:`apply_plan`) and reports what stays whole
  (:func:`report_unsharded`).

What each style becomes (``mode.sp`` variants as in ``common``):

=================================  ===============================================================
HF style -> class                  primitives
=================================  ===============================================================
``colwise`` -> ``Colwise()``       ``shard(weight/bias, axis=0)``; input gradient all-reduced
``colwise_gather_output``,         as ``colwise``, then ``sync("fwd_post", "all_gather", -1)``
``colwise_rep``
-> ``Colwise(gather_output=True)``
``packed_colwise`` (Linear)        ``shard(..., axis=0, fused=2)``: a slice of each packed block
-> ``Colwise(packed=True)``
``rowwise`` -> ``Rowwise()``       ``shard(weight, axis=1)``; ``sync("fwd_post", "all_reduce")``
``rowwise_split_input``,           ``sync("fwd_pre", "scatter", -1)`` then ``rowwise``
``rowwise_rep``
-> ``Rowwise(split_input=True)``
``packed_rowwise`` (Linear)        ``rowwise`` with ``fused=2``
-> ``Rowwise(packed=True)``
``replicated_with_grad_allreduce`` ``all_reduce_grads()``: whole weights, gradients summed
-> ``ReplicatedGradAllReduce()``
``embedding_rowwise``              vocab-parallel embedding (``common.shard_embedding``)
-> ``Embedding(axis=0)``
``embedding_colwise``              ``shard(weight, axis=1)``; ``sync("fwd_post", "all_gather")``
-> ``Embedding(axis=1)``
``all_reduce``                     ``sync("fwd_post", "all_reduce")``
-> ``AllReduceOutput()``
``replicate`` / ``local_params``   nothing (every rank keeps the whole tensors / runs locally)
-> ``Replicate()``
``moe_tp_experts`` (+ entries      ``moe.shard_experts`` (the entries below it as its plan); the
below it) -> ``Experts()``         sibling router through ``moe.replicate_router``
``mla_kv_a_proj``,                 refused (see :data:`REFUSED`)
``moe_identity_expert``,
``sequence_parallel``
=================================  ===============================================================

Column-parallel projections that read the same input (q/k/v, gate/up) get ONE input-gradient
all-reduce on their parent module, as the hand-written recipes do (``grad_entry``), when the
parent's ``forward`` passes its first argument to nothing but those projections (read from its
source, :func:`group_columns`); otherwise each projection reduces its own. Under TP the kv heads
of a column-parallel attention must divide by the TP size (``ConfigError`` naming the module
otherwise, :func:`check_heads`).

Modules whose parameters the plan leaves whole (norms, an unlisted attention...) are reported:
one ``warnings.warn`` and ``sch.metadata["tp_plan_unsharded"]`` on the root (``explain`` shows it).
"""

from ...primitives.all_reduce_grads import AllReduceGrads
from .apply import apply_plan, check_plan, report_unsharded, unsharded_modules
from .checks import check_heads, check_styles, cover_regions, group_columns, region_params
from .coverage import LayerCoverage, check_coverage, layer_coverage
from .plan import (PlanEntry, check_plan_paths, plan_error, prefix_of, read_plan,
                   resolve_plan)
from .styles import (EXPERTS_STYLE, REFUSED, STYLES, AllReduceOutput, Colwise, Embedding,
                     Experts, PlanContext, Replicate, ReplicatedGradAllReduce, Rowwise, Style,
                     plain_embedding, plain_linear)

COLUMN_STYLES = tuple(name for name, style in STYLES.items() if isinstance(style, Colwise))
"""The HF style strings of column-parallel Linears."""
REPLICATED_STYLES = tuple(name for name, style in STYLES.items() if style.keeps_whole)
"""The HF style strings that keep a module's parameters whole on purpose."""

__all__ = ["PlanEntry", "read_plan", "resolve_plan", "plan_error", "apply_plan", "STYLES",
           "REFUSED", "EXPERTS_STYLE", "COLUMN_STYLES", "REPLICATED_STYLES", "PlanContext",
           "Style", "Colwise", "Rowwise", "ReplicatedGradAllReduce", "Embedding",
           "AllReduceOutput", "Replicate", "Experts", "check_styles", "check_heads",
           "group_columns", "cover_regions", "unsharded_modules", "report_unsharded",
           "plain_embedding", "plain_linear", "AllReduceGrads", "check_plan", "check_plan_paths",
           "prefix_of", "region_params", "LayerCoverage", "layer_coverage", "check_coverage"]
