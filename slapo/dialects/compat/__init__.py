"""Run-time compatibility patches for third-party runtimes (DeepSpeed, megatron-core).

Each module here works around one documented problem (see ``3rdparty/README.md``: why, which
version, when to delete it). Nothing is patched at import time: a dialect or baseline applies a
patch explicitly, only when it is needed (e.g. only on CPU runs).
"""
