"""Start DeepSpeed 0.19 without compiling anything on a fresh machine.

DeepSpeed JIT-compiles C++ ops with g++/nvcc the first time some code paths run; on a fresh cache
that costs about a minute each, and on machines without a compiler it fails. Two such builds are on
the start-up path and both are avoided here, in this one place:

1. ``deepspeed.init_distributed`` constructs its ``TorchBackend``, which calls
   ``deepspeed.comm.torch.build_shm_op()`` to build a shared-memory all-reduce for the CPU
   accelerator (~45 s). Slapo replaces that module-level function with one returning ``None``
   (DeepSpeed's own "op not available" value), so collectives go through ``torch.distributed``
   (gloo on CPU, NCCL on GPU) as usual. The replacement is installed just before
   ``init_distributed`` and kept (it only matters at back-end construction).
2. DeepSpeed's Adam/AdamW builds ``fused_adam`` (~64 s) unless ``torch_adam`` is set.
   :func:`no_build_config` sets ``torch_adam: true`` on Adam/AdamW optimizer sections (unless the
   user chose otherwise) and ``zero_allow_untested_optimizer: true`` so a plain torch optimizer can
   be passed instead.

See ``3rdparty/README.md`` for when to delete this.
"""

from __future__ import annotations

import copy
import sys
from types import ModuleType
from typing import Any, Dict

from ...errors import BuildError

__all__ = ["import_deepspeed", "init_deepspeed_comm", "no_build_config", "INSTALL_HINT"]

INSTALL_HINT = ("install it with `DS_BUILD_OPS=0 pip install deepspeed==0.19.8` "
                "(DS_BUILD_OPS=0: no C++ op is compiled at install time)")


def import_deepspeed() -> ModuleType:
    """``import deepspeed``, or a :class:`BuildError` with an install hint."""
    try:
        import deepspeed
    except ImportError as e:
        raise BuildError(f"DeepSpeed is not installed ({e})", call="build(target='deepspeed')",
                         hint=INSTALL_HINT) from e
    return deepspeed


def _no_shm_op() -> None:
    return None


def init_deepspeed_comm(backend: str, timeout: Any) -> None:
    """Create DeepSpeed's communication back-end over the already initialised default group,
    without building its shared-memory op. Idempotent; undone by
    :func:`slapo.runtime.distributed.teardown`."""
    deepspeed = import_deepspeed()
    import deepspeed.comm.comm as ds_comm

    from ...runtime.distributed import register_teardown

    sys.modules["deepspeed.comm.torch"].build_shm_op = _no_shm_op  # see the module docstring
    if ds_comm.cdb is None:
        deepspeed.init_distributed(dist_backend=backend, timeout=timeout, verbose=False)
    register_teardown(_reset_comm)


def _reset_comm() -> None:
    import deepspeed.comm.comm as ds_comm

    ds_comm.cdb = None


def no_build_config(config: Dict[str, Any], torch_optimizer: bool) -> Dict[str, Any]:
    """A copy of the DeepSpeed ``config`` that needs no C++ build at start-up.

    ``torch_optimizer``: a torch optimizer will be passed to ``deepspeed.initialize`` (allowed
    under ZeRO with ``zero_allow_untested_optimizer``).
    """
    config = copy.deepcopy(config)
    if torch_optimizer:
        config.setdefault("zero_allow_untested_optimizer", True)
    section = config.get("optimizer")
    if isinstance(section, dict) and str(section.get("type", "")).lower() in ("adam", "adamw"):
        section.setdefault("params", {}).setdefault("torch_adam", True)
    return config
