"""Shared helpers for the tests that start a sweep or a launcher and look at its processes."""

import random
import socket

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


def free_port() -> int:
    """A port free now for a rendezvous, chosen below Linux's ephemeral range (32768-60999):
    a port the kernel handed out (bind to 0) is also what the next outgoing connection of
    another test's gloo ranks may take before the launcher binds it (EADDRINUSE, a fail row:
    seen once on CI). Random, so two pytest workers rarely pick the same one."""
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randrange(20000, 32000)
        if port in range(29400, 29600):  # torchrun's and DeepSpeed's default ports
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000 after 100 tries")
