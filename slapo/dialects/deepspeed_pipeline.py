"""The ``deepspeed`` target for schedules with pipeline cuts: a DeepSpeed ``PipelineModule``.

``build(sch, target="deepspeed", config=...)`` on a schedule with ``cut_pipeline_stage`` marks
returns ``(engine, optimizer)``, ``engine`` being DeepSpeed's ``PipelineEngine``; train with
``engine.train_batch(data_iter)``. :func:`pipeline_items` turns a dict batch into the items that
``train_batch`` reads (one per micro-batch)::

    engine, _ = slapo.build(sch, target="deepspeed", config={
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2})
    loss = engine.train_batch(pipeline_items(engine, batch))   # batch: 4 samples per replica

How the stages become DeepSpeed layers:

* the world is laid out as in :mod:`slapo.dialects.layout` and given to DeepSpeed as a
  ``PipeModelDataParallelTopology`` (same rank order); layer ``k`` of the ``PipelineModule`` is
  stage ``k`` (``partition_method="uniform"``), so this rank's layer keeps the original parameter
  paths (``engine.module.get_submodule("1")`` has ``lm_head.weight``, ...).
* DeepSpeed layers take and return one tensor or a tuple of tensors. Stage 0 takes the tuple of
  ``input_names`` (default: the inputs given when the model was traced, in signature order; the
  other arguments keep their defaults). Between stages, tensors that DeepSpeed cannot treat as
  activations are re-encoded losslessly: floating tensors that need no gradient travel bit-cast
  to integers and bools as ``uint8`` (DeepSpeed sends a gradient back for every floating
  activation), with a trailing code tensor saying how to restore them. DeepSpeed also asserts
  that every floating activation it received got a gradient: a received value that the stage
  does not use on a differentiable path gets a zero one (:class:`_ZeroGrads`).
* loss: by default the last stage returns its output's ``loss`` (labels go through the model as
  an input); with ``loss_fn`` the last stage returns the raw output and DeepSpeed computes
  ``loss_fn(output, labels)``, ``labels`` being the second element of each data item.
* tied weights (e.g. GPT-2's ``wte``/``lm_head``, used by the first and last stage) stay ordinary
  parameters of each stage. DeepSpeed's ``TiedLayerSpec`` does not fit (it ties whole modules
  built from specs); instead :class:`SlapoPipelineModule` fills DeepSpeed's own tie bookkeeping
  (``tied_comms``) from :func:`slapo.pipeline.tied_parameters`, so the engine all-reduces their
  gradients over the stages that share them (one group per pipeline), broadcasts them once at
  start-up, and counts them once in gradient norms (``ds_pipe_replicated``).
* DeepSpeed's activation partitioning over tensor-parallel ranks is switched off
  (``pipeline.pipe_partitioned/grad_partitioned: false``): stages exchange whole tensors.

ZeRO stages 2/3 do not work with DeepSpeed pipelines (refused here); stage 0/1 do.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.fx as fx
from torch import nn

from ..errors import BuildError
from ..pipeline import build_pipeline_stages, tied_parameters
from ..pipeline.runner import _model_loss
from ..primitives.module_checks import closest
from .layout import LayoutGroups

__all__ = ["encode_activations", "decode_activations", "deepspeed_stage", "pipeline_items",
           "build_deepspeed_pipeline"]

# codes of re-encoded activations: index in _CODED (0 = sent as is)
_CODED = [None, torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.bool]
_AS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
       torch.bfloat16: torch.int16, torch.bool: torch.uint8}


def encode_activations(values: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
    """Tensors leaving a stage, as DeepSpeed sends them: contiguous; floating tensors without
    gradient bit-cast to integers and bools viewed as ``uint8``; plus a trailing int64 code
    tensor (0 = as is, else the index of the original dtype in ``_CODED``)."""
    out: List[torch.Tensor] = []
    codes: List[int] = []
    for v in values:
        v = v.contiguous()
        if v.dtype == torch.bool or (v.is_floating_point() and not v.requires_grad):
            codes.append(_CODED.index(v.dtype))
            out.append(v.view(_AS[v.dtype]))
        else:
            codes.append(0)
            out.append(v)
    return (*out, torch.tensor(codes, dtype=torch.long, device=out[0].device if out else None))


def decode_activations(inputs: Any) -> Tuple[torch.Tensor, ...]:
    """Inverse of :func:`encode_activations` (on what DeepSpeed received)."""
    *values, codes = inputs
    return tuple(v if c == 0 else v.view(_CODED[c]) for v, c in zip(values, codes.tolist()))


class _ZeroGrads(torch.autograd.Function):
    """Identity on ``anchor`` whose backward also returns a zero gradient for each of
    ``inputs``. DeepSpeed marks every floating activation it receives as requiring a gradient and
    asserts that each got one; a value that crosses a cut inside a tuple without being used on a
    differentiable path (T5's encoder position bias in a layer's output tuple) would get none."""

    @staticmethod
    def forward(ctx, anchor: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.specs = [(t.shape, t.dtype, t.device) for t in inputs]
        return anchor.view_as(anchor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor, *_: Any) -> Tuple[torch.Tensor, ...]:
        return (grad, *(torch.zeros(s, dtype=d, device=dev) for s, d, dev in ctx.specs))


def _grads_for_received(out: Any, received: Sequence[torch.Tensor]) -> Any:
    """``out`` (a tensor or tuple of tensors) with :class:`_ZeroGrads` on its first tensor that
    requires a gradient, covering every received floating tensor that requires one."""
    needy = [t for t in received if t.is_floating_point() and t.requires_grad]
    outs = list(out) if isinstance(out, tuple) else [out]
    i = next((i for i, t in enumerate(outs) if isinstance(t, torch.Tensor) and t.requires_grad),
             None)
    if not needy or i is None:
        return out
    outs[i] = _ZeroGrads.apply(outs[i], *needy)
    return tuple(outs) if isinstance(out, tuple) else outs[0]


def _as_tuple(inputs: Any) -> Tuple[Any, ...]:
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def traced_input_names(stage0: fx.GraphModule) -> List[str]:
    """Stage 0's arguments that were tensors in the traced example, in signature order."""
    return [n.target for n in stage0.graph.nodes if n.op == "placeholder"
            and isinstance(n.meta.get("val"), torch.Tensor)]


def deepspeed_stage(stage: fx.GraphModule, input_names: Optional[Sequence[str]],
                    loss_in_stage: bool) -> fx.GraphModule:
    """``stage`` as a DeepSpeed layer: one argument (a tensor or tuple), same parameter paths.

    Stage 0 reads ``input_names`` from the tuple; later stages decode what the stage before
    sent. Non-last stages encode their outputs; the last returns its output's ``loss`` when
    ``loss_in_stage``, else the raw output.
    """
    info = stage.meta["slapo_stage"]
    k, num = info["index"], info["num_stages"]
    g = fx.Graph()
    inputs = g.placeholder("inputs")
    args = g.call_function(_as_tuple if k == 0 else decode_activations, (inputs,))
    env: Dict[fx.Node, Any] = {}
    for i, ph in enumerate(n for n in stage.graph.nodes if n.op == "placeholder"):
        name = ph.target
        if k > 0:
            env[ph] = g.call_function(operator.getitem, (args, i))
        elif name in input_names:
            env[ph] = g.call_function(operator.getitem, (args, list(input_names).index(name)))
        elif name.startswith("**"):
            env[ph] = {}
        elif name.startswith("*"):
            env[ph] = ()
        else:
            env[ph] = ph.args[0] if ph.args else None
    out = g.graph_copy(stage.graph, env)
    if k < num - 1:
        out = g.call_function(encode_activations, (out,))
    elif loss_in_stage:
        out = g.call_function(_model_loss, (out,))
    if k > 0:
        out = g.call_function(_grads_for_received, (out, args))
    g.output(out)
    gm = fx.GraphModule(stage, g, class_name=f"DeepSpeedStage{k}")
    gm.meta["slapo_stage"] = dict(info, input_names=list(input_names or []) if k == 0 else None)
    return gm


class _TiedParameter(nn.Module):
    """Holds one tied parameter for DeepSpeed's bookkeeping (``tied_comms[..]['module']``); not
    a submodule of the pipeline module."""

    def __init__(self, param: nn.Parameter):
        super().__init__()
        self.weight = param


_PIPE_CLASS: Optional[type] = None


def _pipeline_module_class() -> type:
    """:class:`SlapoPipelineModule`, created on first use (DeepSpeed is imported lazily)."""
    global _PIPE_CLASS
    if _PIPE_CLASS is not None:
        return _PIPE_CLASS
    from deepspeed.pipe import PipelineModule

    class SlapoPipelineModule(PipelineModule):
        """A ``PipelineModule`` whose layer ``k`` is Slapo stage ``k``; tied parameters across
        stages are registered in DeepSpeed's ``tied_comms`` (module docstring)."""

        def __init__(self, layers: List[nn.Module], topology: Any, groups: LayoutGroups,
                     ties: List[List[Tuple[int, str]]], input_names: List[str],
                     loss_fn: Optional[Callable[..., torch.Tensor]]):
            # read by _index_tied_modules, which PipelineModule.__init__ calls
            object.__setattr__(self, "_slapo_groups", groups)
            object.__setattr__(self, "_slapo_ties", ties)
            super().__init__(layers=layers, topology=topology, loss_fn=loss_fn,
                             partition_method="uniform")
            self.input_names = input_names

        def _index_tied_modules(self) -> Dict[str, Dict[str, Any]]:
            groups: LayoutGroups = self._slapo_groups
            local = self.get_submodule(str(self.stage_id))
            comms: Dict[str, Dict[str, Any]] = {}
            for i, tie in enumerate(self._slapo_ties):  # same order on every rank
                stages = sorted({s for s, _ in tie})
                group = groups.tie_group(stages)
                mine = [name for s, name in tie if s == self.stage_id]
                if not mine:
                    continue
                ranks = groups.layout.group_of(groups.layout.stage_groups(stages), groups.rank)
                param = local.get_parameter(mine[0])
                comms[f"slapo_tie_{i}"] = {"ranks": ranks, "group": group, "weight_attr": [],
                                           "module": _TiedParameter(param), "param": param}
                if groups.rank != ranks[0]:
                    param.ds_pipe_replicated = True  # count it once in gradient norms
            return comms

        def _synchronize_tied_weights(self) -> None:
            for comm in self.tied_comms.values():
                dist.broadcast(comm["param"].data, src=min(comm["ranks"]), group=comm["group"])

        def allreduce_tied_weight_gradients(self) -> None:
            for comm in self.tied_comms.values():
                if comm["param"].grad is not None:
                    dist.all_reduce(comm["param"].grad, group=comm["group"])

        def get_tied_weights_and_groups(self) -> List[Tuple[nn.Parameter, Any]]:
            return [(comm["param"], comm["group"]) for comm in self.tied_comms.values()]

    _PIPE_CLASS = SlapoPipelineModule
    return SlapoPipelineModule


def pipeline_items(engine: Any, batch: Dict[str, torch.Tensor]) -> Iterator[Tuple[Any, Any]]:
    """The data items ``engine.train_batch`` reads for ``batch`` (this replica's keyword
    inputs, batch first): ``gradient_accumulation_steps`` micro-batches, each
    ``(tuple of the input_names tensors, labels)``; ``labels`` is ``batch["labels"]`` when
    present (used only by a ``loss_fn``), else zeros.

    Raises:
        BuildError: an input name is missing from ``batch``, or the batch does not split.
    """
    names = engine.module.input_names
    missing = [n for n in names if n not in batch]
    n_micro = engine.gradient_accumulation_steps()
    if missing:
        raise BuildError(f"the batch lacks input(s) {missing}", call="pipeline_items",
                         hint=f"the first stage reads {names} (build option input_names)")
    size = batch[names[0]].shape[0] if names else 0
    if size % n_micro:
        raise BuildError(f"a batch of {size} does not split into {n_micro} micro-batches",
                         call="pipeline_items",
                         hint="the batch must be train_micro_batch_size_per_gpu x "
                              "gradient_accumulation_steps samples")
    step = size // n_micro
    labels = batch.get("labels")
    for i in range(n_micro):
        part = slice(i * step, (i + 1) * step)
        inputs = tuple(batch[n][part] for n in names)
        yield inputs, labels[part] if labels is not None else torch.zeros(step)


def build_deepspeed_pipeline(sch, model: nn.Module, config: Dict[str, Any], optimizer: Any,
                             loss_fn: Optional[Callable[..., torch.Tensor]],
                             input_names: Optional[Sequence[str]]) -> Tuple[Any, Any]:
    """``build(sch, target="deepspeed")`` for a schedule with pipeline cuts (module docstring).

    ``config`` is already checked and made build-free by the caller.

    Raises:
        BuildError: ZeRO stage 2/3; unknown ``input_names``; the world does not fit the stages.
    """
    from .compat.deepspeed_startup import import_deepspeed, init_deepspeed_comm
    from ..runtime.distributed import default_timeout, init_distributed
    from ..pipeline.memory import release_other_stages
    from .common import has_tp_shards, make_optimizer, pipeline_groups, \
        tag_tensor_parallel_params

    zero = (config.get("zero_optimization") or {}).get("stage", 0)
    if zero >= 2:
        raise BuildError(f"ZeRO stage {zero} cannot be combined with DeepSpeed pipeline stages",
                         call="build(target='deepspeed')",
                         hint="use zero_optimization.stage 0 or 1 with pipeline cuts")
    deepspeed = import_deepspeed()
    stages = build_pipeline_stages(sch)
    names = list(input_names) if input_names is not None else traced_input_names(stages[0])
    known = [n.target for n in stages[0].graph.nodes if n.op == "placeholder"]
    for n in names:
        if n not in known:
            raise BuildError(f"input_names: the model takes no argument {n!r}",
                             call="build(target='deepspeed')", hint=closest(n, known))
    if not names:
        raise BuildError("no input names for the first stage", call="build(target='deepspeed')",
                         hint="pass input_names=('input_ids', ...), the order of the tensors in "
                              "each data item's inputs tuple")
    env = init_distributed()
    init_deepspeed_comm(env.backend, default_timeout())
    groups = pipeline_groups(sch, model, len(stages), "deepspeed")
    layout = groups.layout
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    topology = PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp,
                                             num_dp=layout.dp)
    layers = [deepspeed_stage(st, names, loss_in_stage=loss_fn is None) for st in stages]
    stages[groups.coords.stage].to(env.device)
    if has_tp_shards(model):
        tag_tensor_parallel_params(model)
    pipe = _pipeline_module_class()(layers, topology, groups, tied_parameters(stages), names,
                                    loss_fn)
    release_other_stages(stages, groups.coords.stage)  # DeepSpeed runs only its own layer
    use_torch_optimizer = optimizer is not None or "optimizer" not in config
    opt = make_optimizer(pipe, optimizer) if use_torch_optimizer else None
    engine, ds_opt, _, _ = deepspeed.initialize(
        model=pipe, optimizer=opt, config=config, dist_init_required=False,
        model_parameters=[p for p in pipe.parameters() if p.requires_grad])
    return engine, ds_opt
