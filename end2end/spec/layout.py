"""How a run lays its ranks and its batch out: :class:`Layout` and :func:`run_layout`.

The world is TP x DP x PP (:mod:`slapo.dialects.layout`: tensor-parallel ranks fastest, then the
data-parallel replica, then the pipeline stage). A data-parallel replica trains on
``local_batch = B / DP`` samples per step, split into ``num_microbatches`` micro-batches of
``micro_batch_size`` samples (gradient accumulation without a pipeline, in every mode; the
micro-batches of a pipeline). The driver (:mod:`end2end.driver.bench`) and the simulator check
a run with the same :func:`run_layout`, so an unsupported layout is the same ``ConfigError``
in both.

Results files keep the layout's older record names (``micro_batch``, ``microbatches``:
:meth:`Layout.as_record`) so that committed rows stay readable.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping

from slapo.errors import ConfigError

from end2end.spec.modes import get_mode

__all__ = ["Layout", "run_layout", "check_pipeline_mode", "default_micro_batch"]

_RECORD_NAMES = dict(micro_batch_size="micro_batch", num_microbatches="microbatches")


@dataclasses.dataclass(frozen=True)
class Layout:
    """A run's parallel sizes and this replica's batch (see the module docstring)."""

    tp: int
    pp: int
    dp: int
    local_batch: int
    micro_batch_size: int
    num_microbatches: int

    def replica(self, rank: int) -> int:
        """The data-parallel replica of global rank ``rank`` (its batch's seed)."""
        return (rank // self.tp) % self.dp

    def stage(self, rank: int) -> int:
        """The pipeline stage of global rank ``rank``."""
        return rank // (self.tp * self.dp)

    def stage_leaders(self) -> List[int]:
        """The first global rank of each pipeline stage."""
        return [s * self.tp * self.dp for s in range(self.pp)]

    def with_microbatches(self, k: int) -> "Layout":
        """The same layout with a replica batch of ``k`` micro-batches."""
        return dataclasses.replace(self, local_batch=self.micro_batch_size * k,
                                   num_microbatches=k)

    def as_record(self) -> Dict[str, int]:
        """The layout as results files record it (``tp pp dp local_batch micro_batch
        microbatches``, in that order)."""
        return {_RECORD_NAMES.get(f.name, f.name): getattr(self, f.name)
                for f in dataclasses.fields(self)}

    @classmethod
    def from_record(cls, record: Mapping[str, int]) -> "Layout":
        """The layout of :meth:`as_record` (``ValueError`` naming a missing or unknown key)."""
        names = {v: k for k, v in _RECORD_NAMES.items()}
        fields = {names.get(k, k): int(v) for k, v in record.items()}
        expected = {f.name for f in dataclasses.fields(cls)}
        if set(fields) != expected:
            raise ValueError(f"a layout record needs exactly the keys of Layout.as_record(); "
                             f"missing {sorted(expected - set(fields))}, unknown "
                             f"{sorted(set(fields) - expected)}")
        return cls(**fields)


def check_pipeline_mode(mode: str, pp: int) -> None:
    """Raise :class:`ConfigError` (naming what to use instead) when ``mode`` cannot run ``pp``
    pipeline stages (:attr:`end2end.spec.modes.Mode.pipeline_target`); a no-op for
    ``pp == 1``."""
    info = get_mode(mode)
    if pp <= 1 or info.pipeline_enabled:
        return
    why, hint = info.pipeline_refusal
    raise ConfigError(f"--pp {pp}: pipeline parallelism is not available in mode {mode!r}: "
                      f"{why}", call="end2end.bench", hint=hint)


def default_micro_batch(local_batch: int, pp: int) -> int:
    """Micro-batch size when none is given: ``local_batch / pp`` if it divides, else the whole
    batch (for ``pp == 1``: the whole batch, no gradient accumulation)."""
    if pp > 1 and local_batch % pp == 0:
        return local_batch // pp
    return local_batch


def run_layout(spec) -> Layout:
    """The :class:`Layout` of a :class:`~end2end.spec.runspec.RunSpec`; ``ConfigError`` if
    the run is unsupported (a mode that cannot pipeline, TP x PP not dividing the ranks, a
    batch not divisible by DP or by the micro-batch)."""
    tp, pp, dp = spec.parallel_sizes
    check_pipeline_mode(spec.mode, pp)
    spec.mode_info.check_tp(tp, pp, spec.n)
    if spec.n % (tp * pp):
        raise ConfigError(f"tp={tp} x pp={pp} does not divide the {spec.n} ranks",
                          call="end2end.bench", hint="choose tp and pp dividing the world size")
    if spec.batch_size % dp:
        raise ConfigError(f"global batch {spec.batch_size} is not divisible by the "
                          f"{dp} data-parallel ranks", call="end2end.bench",
                          hint="choose a batch that is a multiple of the DP size")
    local = spec.batch_size // dp
    micro = spec.micro_batch or default_micro_batch(local, pp)
    if local % micro:
        raise ConfigError(f"the per-rank batch {local} is not a multiple of micro-batch {micro}",
                          call="end2end.bench")
    return Layout(tp, pp, dp, local, micro, local // micro)
