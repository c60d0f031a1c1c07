"""The harness's runs at their real size without their arithmetic: every line of a config on
fake tensors and a fake process group, one training step per distinct rank through the driver's
own code, and a time and memory prediction per device profile (docs/simulate.md;
``python -m end2end.simulate CONFIG --device PROFILE``)."""
