"""The benchmark harness (Figure 7, Figure 8): packages by concern, each importing only those
below it (the ``end2end-layers`` contract in ``pyproject.toml``; map in docs/internals.md):

* :mod:`end2end.models`  the model zoo, model building, WideResNet, FLOP counts;
* :mod:`end2end.spec`    config grammar, batch expressions, run specs, knobs, the table of modes;
* :mod:`end2end.results` results files, environment dumps, statistics, summaries, plots;
* :mod:`end2end.driver`  the one training driver, runtimes, measurement, profiling, pipelines, A/B;
* :mod:`end2end.sweep`   sweeps of a config, command lines, processes, progress, locks, multi-node.

The command names of earlier versions still work: ``python -m end2end.bench|plot|ab|profiling``
and ``python -m end2end.multi_node.launch`` forward to their modules here.
"""
