"""The harness's runs at their real size without their arithmetic: every line of a config on
fake tensors and a fake process group, one training step per distinct rank through the driver's
own code, and a time and memory prediction per device profile (docs/simulate.md;
``python -m end2end.simulate CONFIG --device PROFILE``).

In layers, each importing only those below it (contract ``simulate-layers`` in pyproject.toml):

* the command-line tools, the modules of this package: ``__main__`` (a config), ``one`` (one
  run as a JSON line), ``proof`` (measured vs simulated on this CPU), ``explain`` (a line's
  real step beside its prediction), ``compare`` (measured rows beside predictions), ``check``
  (a config checked before a real run), ``calibrate`` (measure the ``cpu`` profile), and
  ``profiles`` (the device profiles' public names, for callers outside);
* :mod:`.calibration`: measuring this machine for the ``cpu`` profile (``cpu``, ``eager``,
  ``zero3``);
* :mod:`.engine`: one run simulated: the fake world, the recorder, a rank's step, micro-batch
  extrapolation, modelled runtimes, the run and its worker process;
* :mod:`.cost`: what a step costs: the records priced, device profiles (and the ``cpu`` one's
  file), the time model, the CPU's eager model, the GPU attention kernel, extra FLOPs.
"""
