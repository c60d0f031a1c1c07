"""Run one simulation in a fresh process: :func:`isolated` calls a function of this package in
``python -c`` and returns what it returns (JSON).

A process should simulate one run only: the runtimes keep global state (megatron-core's parallel
state, process groups, caches of fake tensors) and several fake worlds in one process have been
seen to corrupt the heap (glibc aborts in a later, unrelated allocation). ``python -m
end2end.simulate`` therefore starts a worker per run (:mod:`end2end.simulate.engine.worker`); the
calibration and the tests use this helper for their own simulations.

Even one simulation per process aborted now and then in glibc ("corrupted double-linked list",
exit -6, or a segfault): seen in about one of ten short runs of ZeRO-3's stand-in with three
accumulated micro-batches of a Slapo-scheduled LLaMA-7B and of a Slapo ``tiny/bert``. The cause,
found later under valgrind, was a double free of storage weak references when a deep copy of a
fake tensor copied its mode (fixed in :mod:`~end2end.simulate.engine.fake_world`). A
simulation is deterministic, so a process killed by a signal is still run once more, and the
retry is said on stderr; a second death is the ``RuntimeError`` as any failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

__all__ = ["isolated"]

_CODE = """
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import importlib
module, name = sys.argv[1].rsplit(".", 1)
out = getattr(importlib.import_module(module), name)(*json.loads(sys.argv[2]))
sys.stdout.write("\\n@result " + json.dumps(out, default=str) + "\\n")
sys.stdout.flush()
os._exit(0)
"""


def isolated(function: str, *args: Any, timeout: float = 900) -> Any:
    """``function(*args)`` (a dotted name, JSON arguments and result) in a fresh process, run
    once more if a signal killed it (module docstring); ``RuntimeError`` with the process's
    last lines when it fails."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-c", _CODE, function, json.dumps(list(args))]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode < 0:
        print(f"isolated: {function} died of signal {-proc.returncode} "
              f"({_tail(proc)}); running it once more", file=sys.stderr)
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [ln[len("@result "):] for ln in proc.stdout.splitlines() if ln.startswith("@result ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{function}{tuple(args)} failed (exit {proc.returncode}): "
                           f"{_tail(proc)}")
    return json.loads(lines[-1])


def _tail(proc: subprocess.CompletedProcess) -> str:
    return " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
