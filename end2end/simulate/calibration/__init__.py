"""Measuring this machine for the simulator's ``cpu`` profile: the file's numbers (``cpu``),
the eager-PyTorch model (``eager``) and DeepSpeed ZeRO-3's per-step Python (``zero3``). Above
the engine (its memory relation simulates two reference runs) and the cost model."""
