"""Runtime dialects: how a built model is handed to a training runtime (``build(target=...)``).

Registered explicitly: ``torch`` (plain PyTorch, the default), ``deepspeed``, ``fsdp`` (FSDP2)
and ``megatron``.
Framework imports are lazy: importing slapo imports neither DeepSpeed nor megatron-core.
"""

from . import deepspeed, fsdp, megatron, torch_native  # noqa: F401  (register)
from .registry import Dialect, get_dialect, list_dialects, register_dialect

__all__ = ["Dialect", "register_dialect", "get_dialect", "list_dialects"]
