"""Stop and resume a driver run: ``--save-every N`` and ``--resume DIR``.

``--save-every N`` writes the whole training state (:func:`slapo.save_training_state`: model
shards, optimizer state, step, RNG streams; torch.distributed.checkpoint) after every ``N``-th
optimizer step of the run (warm-up steps count) into ``--save-dir/step-<k>`` (default
``<results>.state/<run>/step-<k>``, ``<run>`` naming the run: :func:`run_dir_name`, so the runs
of one sweep never share a directory). ``--resume DIR`` loads such a state (``DIR`` is one
``step-<k>`` directory, a save directory: its latest ``step-<k>``, or a directory holding the
run's ``<run>`` save directory, e.g. a sweep's ``<results>.state``) before the first step and
runs only the steps after ``k``: the losses are those the uninterrupted run has from step
``k + 1`` on, bit-exact on CPU. The row's ``Resumed`` column reads ``from step k`` and its
``extra.resumed`` records where the run resumed from.

In a config, ``#@ save_every=N`` and ``#@ resume=DIR`` pass the flags to the following runs
(:mod:`end2end.spec.config_file`): ``#@ resume=results/x.tsv.state`` resumes each run of a sweep
from its own latest state.

Supported where the mode's runner trains an ``nn.Module`` with a torch optimizer (``slapo``,
``slapo-megatron``, ``eager``, ``slapo-fsdp``, ...); pipelines and DeepSpeed engines refuse
with a ``ConfigError`` (a ``fail`` row).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
from typing import Any, Dict, Optional

__all__ = ["add_arguments", "Checkpointer", "latest_state", "run_dir_name", "resumed_cell"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The driver's ``--save-every``, ``--save-dir`` and ``--resume`` options."""
    from end2end.cli import number

    p.add_argument("--save-every", type=number(int, minimum=1), default=None, metavar="N",
                   help="save the training state after every N-th step (DCP; warm-up steps "
                   "count) into --save-dir/step-<k>")
    p.add_argument("--save-dir", default=None, metavar="DIR",
                   help="where --save-every writes (default: <results>.state/<run>)")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue from a saved state (a step-<k> directory, a save "
                   "directory: its latest step, or one holding this run's <run> save "
                   "directory) and run only the steps after it")


def run_dir_name(spec: Any) -> str:
    """A directory name for one run (its key made file-safe, plus a hash of the key)."""
    text = "_".join(str(k) for k in spec.key if k not in ("", None))
    digest = hashlib.sha1(repr(spec.key).encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9.=-]+', '_', text)}-{digest}"


def resumed_cell(extra: Dict[str, Any]) -> str:
    """The row's ``Resumed`` cell: ``from step K`` for a resumed run, else ``""``."""
    info = extra.get("resumed")
    return f"from step {info['step']}" if info else ""


def latest_state(directory: str, run: Optional[str] = None) -> str:
    """``directory`` itself if it is a saved state, else its ``step-<k>`` with the largest k,
    else (given the run's :func:`run_dir_name`) the latest state in ``directory/<run>``."""
    if os.path.isfile(os.path.join(directory, ".metadata")):
        return directory
    if run and os.path.isdir(os.path.join(directory, run)):
        return latest_state(os.path.join(directory, run))
    steps = sorted((int(m.group(1)), name) for name in (os.listdir(directory)
                   if os.path.isdir(directory) else [])
                   if (m := re.fullmatch(r"step-(\d+)", name)))
    if not steps:
        from slapo.errors import ConfigError

        mine = f", no {run} directory" if run else ""
        raise ConfigError(f"--resume {directory}: no saved state there (no .metadata, no "
                          f"step-<k> directory{mine})",
                          hint="pass a directory written by --save-every")
    return os.path.join(directory, steps[-1][1])


class Checkpointer:
    """Saves and restores one run's training state (collective: every rank calls it)."""

    def __init__(self, args: argparse.Namespace, spec: Any):
        self.every: Optional[int] = getattr(args, "save_every", None)
        self.run = run_dir_name(spec)
        self.dir = getattr(args, "save_dir", None) or os.path.join(f"{args.results}.state",
                                                                   self.run)
        self.resume: Optional[str] = getattr(args, "resume", None)

    @property
    def active(self) -> bool:
        return bool(self.every or self.resume)

    def _check(self, runner: Any) -> None:
        import torch
        from slapo.errors import ConfigError

        if not isinstance(runner.model, torch.nn.Module) or not isinstance(
                runner.optimizer, torch.optim.Optimizer) or hasattr(runner.model, "train_step"):
            raise ConfigError(f"--save-every/--resume: mode '{runner.mode}' trains no plain "
                              "module with a torch optimizer (a pipeline or a DeepSpeed engine)",
                              hint="use slapo, slapo-megatron, eager or slapo-fsdp, or drop "
                              "the flags")

    def restore(self, runner: Any, extra: Dict[str, Any], total: int) -> int:
        """Load the ``--resume`` state into the runner; the number of steps already done (of
        the run's ``total``: a state at or past it leaves nothing to train and is refused)."""
        if not self.active:
            return 0
        self._check(runner)
        if not self.resume:
            return 0
        import slapo

        path = latest_state(self.resume, self.run)
        state = slapo.load_training_state(path, runner.model, runner.optimizer)
        if state.step >= total:
            from slapo.errors import ConfigError

            raise ConfigError(f"--resume {path}: the state is at step {state.step} but the run "
                              f"has {total} steps (warm-up included), so none is left to train",
                              hint="resume from an earlier step-<k> or raise --steps")
        extra["resumed"] = {"from": os.path.abspath(path), "step": state.step,
                            "saved_world_size": state.saved_world_size,
                            "rng_restored": state.rng_restored}
        return state.step

    def after_step(self, runner: Any, step: int, extra: Dict[str, Any]) -> None:
        """Save after step ``step`` (1-based count of the run's steps) when it is due."""
        if not self.every or step % self.every:
            return
        import slapo

        path = os.path.join(self.dir, f"step-{step:06d}")
        slapo.save_training_state(path, runner.model, runner.optimizer, step=step,
                                  data_position={"step": step})
        extra.setdefault("saved", []).append(os.path.abspath(path))
