"""Environment dump: what a benchmark sweep ran on (stored in every results file's header).

``env_dump()`` is cheap (no heavy imports: versions come from package metadata, except torch
which is imported anyway) and never fails: missing pieces read ``"n/a"``.
``python scripts/env_dump.py`` prints it.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Optional

__all__ = ["env_dump", "package_version", "git_commit", "cpu_model", "format_env"]

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("torch", "transformers", "deepspeed", "megatron-core", "numpy", "pandas",
            "matplotlib", "slapo")
NA = "n/a"


def package_version(name: str) -> str:
    """Installed version of distribution ``name`` (without importing it), or ``"n/a"``."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return NA


def git_commit(root: Path = REPO_ROOT) -> str:
    """Short commit hash of ``root`` with a ``-dirty`` suffix for uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return NA
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=20)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return NA


def cpu_model() -> str:
    """The CPU model name (``/proc/cpuinfo`` on Linux, ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or NA


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return ",".join(f for f in ("avx2", "fma", "avx512f", "amx_tile") if f in flags)
    except OSError:
        pass
    return NA


def _torch_info(device: Optional[str]) -> Dict[str, Any]:
    import torch

    info: Dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda or NA,
        "cuda_available": torch.cuda.is_available(),
    }
    use_cuda = torch.cuda.is_available() and (device is None or device.startswith("cuda"))
    if use_cuda:
        info["device"] = torch.cuda.get_device_name(0)
        info["device_count"] = torch.cuda.device_count()
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(
            torch.cuda, "nccl") else NA
    else:
        info["device"] = "cpu: " + cpu_model()
        info["device_count"] = len(os.sched_getaffinity(0)) if hasattr(
            os, "sched_getaffinity") else (os.cpu_count() or 1)
    config = torch.__config__.show()
    for key in ("BLAS_INFO", "LAPACK_INFO"):
        for part in config.replace(",", "\n").splitlines():
            if key in part:
                info[key.lower()] = part.split("=", 1)[-1].strip()
    return info


def env_dump(device: Optional[str] = None) -> Dict[str, Any]:
    """Versions, git commit, device, CPU and threads, as a flat JSON-able dict.

    Args:
        device: the benchmark device (``"cpu"``, ``"cuda"``); default: CUDA if available.
    """
    env: Dict[str, Any] = {
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": git_commit(),
        "cpu_model": cpu_model(),
        "cpu_flags": _cpu_flags(),
        "cpu_count": os.cpu_count() or 0,
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", NA),
    }
    for name in PACKAGES:
        env[name.replace("-", "_")] = package_version(name)
    try:
        env.update(_torch_info(device))
    except Exception as exc:  # noqa: BLE001  (recorded in the environment dump)
        env["torch_error"] = repr(exc)
    return env


def format_env(env: Dict[str, Any]) -> str:
    """``key: value`` lines, sorted, for humans."""
    width = max(len(k) for k in env) if env else 0
    return "\n".join(f"{k:<{width}}  {v}" for k, v in sorted(env.items()))
