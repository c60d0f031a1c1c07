"""Shared helpers for the tests that start a sweep or a launcher and look at its processes."""

import psutil


def command_line(proc: psutil.Process) -> str:
    """A process's command line, or "" for one that exited (a zombie, or gone) while we looked:
    torchrun's short-lived helpers do that, and must not fail the test that lists them."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def driver_ranks(procs) -> list:
    """The training-driver ranks (``end2end.bench``) among ``procs``, not their torchrun agents."""
    return [p for p in procs if "end2end.bench" in command_line(p)
            and "torch.distributed.run" not in command_line(p)]
