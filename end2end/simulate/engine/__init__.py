"""The simulator's engine: one run simulated on fake tensors and a fake process group, a rank's
step through the driver's own code (``step``), recorded (``recorder``), extrapolated over
micro-batches (``microbatches``), with the runtimes that cannot run on fake tensors modelled
(``modelled``), a run's rows (``run``) from a worker process per run (``worker``,
``isolated``). It prices with :mod:`end2end.simulate.cost` and imports nothing above it."""
