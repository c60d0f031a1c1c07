"""What a simulated step costs: the records priced (``records``), the device profiles
(``profiles``, with the ``cpu`` one's calibration file), the time model (``timing``),
the CPU's eager-PyTorch model (``cpu_model``), CUDA's fused attention on fake CPU tensors
(``kernels``) and the FLOPs torch's table lacks (``op_flops``). The bottom layer of the
simulator: it imports none of its other packages."""
