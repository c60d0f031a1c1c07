"""Training pipeline stages, one per rank, with ``torch.distributed.pipelining``:
:class:`PipelineRunner` (GPipe or 1F1B, gradients of weights tied across stages all-reduced),
and :func:`tied_parameters`, which finds those weights. The stages come from
:func:`slapo.pipeline.build_pipeline_stages`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from ..errors import PipelineError

__all__ = ["PipelineRunner", "tied_parameters"]


def tied_parameters(stages: Sequence[nn.Module]) -> List[List[Tuple[int, str]]]:
    """Groups ``[(stage, name), ...]`` of one parameter object used by several stages."""
    groups: Dict[int, List[Tuple[int, str]]] = {}
    for k, mod in enumerate(stages):
        seen = set()
        for name, p in mod.named_parameters(remove_duplicate=False):
            if id(p) not in seen:
                seen.add(id(p))
                groups.setdefault(id(p), []).append((k, name))
    return [g for g in groups.values() if len({s for s, _ in g}) > 1]


def _model_loss(out: Any) -> torch.Tensor:
    loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    if loss is None:
        raise PipelineError("the last stage returned no loss", call="PipelineRunner",
                            hint="pass loss_of=<fn(output) -> scalar> or give labels")
    return loss


class _LossStage(nn.Module):
    def __init__(self, stage: nn.Module, loss_of: Callable[[Any], torch.Tensor]):
        super().__init__()
        self.stage, self.loss_of = stage, loss_of

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.loss_of(self.stage(*args, **kwargs))


class _ContiguousStage(nn.Module):
    """A non-last stage whose outputs are contiguous: runtimes send and receive into buffers laid
    out like the example outputs, and point-to-point ops need contiguous tensors (crossing
    values such as expanded masks or rotary tables are often views)."""

    def __init__(self, stage: nn.Module):
        super().__init__()
        self.stage = stage

    def forward(self, *args: Any, **kwargs: Any) -> Tuple[torch.Tensor, ...]:
        return tuple(t.contiguous() for t in self.stage(*args, **kwargs))


class PipelineRunner:
    """Trains stage ``rank`` of ``stages`` with ``torch.distributed.pipelining``.

    The stage's schedule is built by :meth:`prepare`, which the first :meth:`step` calls unless
    it was called before (e.g. to keep the build out of a timed step).

    Args:
        stages: all stage modules (from :func:`build_pipeline_stages`); this rank runs
            ``stages[stage_index]`` (default: its rank); the stages before it run once, on
            ``device``, to derive the values passed into it.
        n_microbatches: microbatches per step (the batch must divide evenly).
        schedule: ``"gpipe"`` or ``"1f1b"``.
        loss_of: ``fn(last stage output) -> scalar``; default: the output's ``loss``.
        group: the pipeline's process group (stage ``k`` runs on its group rank ``k``).
        tie_group_fn: ``fn(stage indices) -> group`` joining this pipeline's ranks of those
            stages, for the gradients of parameters tied across them; called on every rank for
            every tie, in the same order (it may create groups). Default: sub-groups of the
            world, which is only right when ``group`` is the world.
        device: where the stage runs (default: the CPU).
        release_others: after that first run, free the other stages' parameters and buffers
            (:func:`slapo.pipeline.memory.release_other_stages`; the dialects do).
    """

    def __init__(self, stages: Sequence[nn.Module], n_microbatches: int, *,
                 schedule: str = "gpipe", stage_index: Optional[int] = None,
                 group: Optional[dist.ProcessGroup] = None,
                 loss_of: Callable[[Any], torch.Tensor] = _model_loss,
                 tie_group_fn: Optional[Callable[[List[int]], Any]] = None,
                 device: Optional[torch.device] = None, release_others: bool = False):
        from torch.distributed import pipelining as pp

        if schedule not in ("gpipe", "1f1b"):
            raise PipelineError(f"unknown schedule {schedule!r}", call="PipelineRunner",
                                hint="use 'gpipe' or '1f1b'")
        self.stages = list(stages)
        self.index = dist.get_rank(group) if stage_index is None else stage_index
        self.n_micro, self.group, self.loss_of = n_microbatches, group, loss_of
        self._pp, self._kind = pp, schedule
        self._schedule: Any = None
        self._device = device or torch.device("cpu")
        self._release_others = release_others
        self._tie_groups = []
        for tie in tied_parameters(self.stages):
            ranks = sorted({s for s, _ in tie})
            if tie_group_fn is not None:
                pg = tie_group_fn(ranks)
            else:
                pg = dist.new_group(ranks) if len(ranks) < dist.get_world_size(group) else group
            mine = [name for s, name in tie if s == self.index]
            if mine:
                self._tie_groups.append((pg, mine[0]))

    @property
    def device(self) -> torch.device:
        """Where this rank's stage runs (and the stages before it run once, in
        :meth:`prepare`)."""
        return self._device

    @property
    def schedule(self) -> Any:
        """This stage's ``torch.distributed.pipelining`` schedule (``ScheduleGPipe`` or
        ``Schedule1F1B``), or ``None`` until :meth:`prepare` (or the first :meth:`step`) has
        built it."""
        return self._schedule

    def prepare(self, inputs: Dict[str, torch.Tensor]) -> Any:
        """Build this stage's schedule ahead of the first :meth:`step`, from a batch of the
        shapes training will use (keyword inputs of the model, batch first, on :attr:`device`);
        returns :attr:`schedule`. Called again, it returns the schedule already built.

        The first :meth:`step` calls it itself; call it earlier to keep the build out of a
        timed or recorded step. The build is local (no communication): the stages up to this
        rank's run once, on one micro-batch, to derive the stage's example inputs and outputs
        (the values passed between stages); their gradients are dropped and, with
        ``release_others``, the other stages' parameters are released. Only the micro-batch's
        shapes matter on stages after the first. A later step's micro-batches must have the
        same shapes.

        Raises:
            PipelineError: no inputs, or a batch whose leading size does not split into
                ``n_microbatches`` equal parts.
        """
        if self._schedule is None:
            self._check_inputs(inputs)
            self._build(inputs)
        return self._schedule

    def _check_inputs(self, inputs: Dict[str, torch.Tensor]) -> None:
        sizes = sorted({v.shape[0] for v in inputs.values() if v.dim() > 0})
        if len(sizes) != 1 or sizes[0] % self.n_micro:
            raise PipelineError(
                f"cannot split a batch with leading sizes {sizes} into {self.n_micro} "
                "micro-batches", call="PipelineRunner.prepare",
                hint=f"give keyword tensors whose batch size is a multiple of {self.n_micro}")

    def _build(self, inputs: Dict[str, torch.Tensor]) -> None:
        pp = self._pp
        micro = {k: v.chunk(self.n_micro)[0] for k, v in inputs.items()}
        args: Any = None
        ins = outs = None
        for k, st in enumerate(self.stages[:self.index + 1]):  # example values, as in training
            st.to(self._device)  # an earlier stage visits the device once (see release_others)
            out = st(**micro) if k == 0 else st(*args)
            if k < len(self.stages) - 1:
                out = tuple(t.detach().contiguous().requires_grad_(t.requires_grad) for t in out)
            if k == self.index:
                ins = tuple(micro.values()) if k == 0 else tuple(args)
                outs = out if k < len(self.stages) - 1 else self.loss_of(out).detach()
            args = out
        for st in self.stages:
            st.zero_grad(set_to_none=True)
        if self._release_others:
            from .memory import release_other_stages

            release_other_stages(self.stages, self.index)
        mod = self.stages[self.index]
        if self.index == len(self.stages) - 1:
            mod = _LossStage(mod, self.loss_of)
        else:
            mod = _ContiguousStage(mod)
        stage = pp.PipelineStage(mod, self.index, len(self.stages), self._device,
                                 input_args=ins, output_args=outs, group=self.group)
        cls = pp.ScheduleGPipe if self._kind == "gpipe" else pp.Schedule1F1B
        self._schedule = cls(stage, self.n_micro, loss_fn=lambda out, target: out)

    def step(self, inputs: Dict[str, torch.Tensor]) -> Optional[torch.Tensor]:
        """Forward + backward of one batch (keyword inputs of the model); gradients are left
        in the stage's parameters. Returns the mean loss on the last stage, else None.
        The first call builds the schedule (:meth:`prepare`) unless it was built before."""
        self.prepare(inputs)
        batch = next(iter(inputs.values())).shape[0]
        losses: List[torch.Tensor] = []
        kwargs = inputs if self.index == 0 else {}
        self._schedule.step(**kwargs, target=torch.zeros(batch), losses=losses,
                            return_outputs=False)
        for pg, name in self._tie_groups:
            p = self.stages[self.index].get_parameter(name)
            if p.grad is not None:
                dist.all_reduce(p.grad, group=pg)
        if losses:
            return torch.stack([loss.detach() for loss in losses]).mean()
        return None
