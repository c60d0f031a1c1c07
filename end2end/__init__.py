"""The benchmark harness (Figure 7, Figure 8): packages by concern, each importing only those
below it (the ``end2end-layers`` contract in ``pyproject.toml``; map in docs/internals.md), from
the bottom up:

* :mod:`end2end.cli`       what every command line shares: help, number checks, errors, logging;
* :mod:`end2end.models`    the model zoo, model building, WideResNet, FLOP counts;
* :mod:`end2end.spec`      config grammar, batch expressions, run specs, knobs, the table of modes;
* :mod:`end2end.results`   results files, environment dumps, statistics, summaries (Figure 7, the
  ablation, the tuning study), plots;
* :mod:`end2end.driver`    the one training driver, runtimes, measurement, profiling, pipelines,
  A/B;
* :mod:`end2end.simulate`  the driver's runs at their real size on fake tensors: predicted memory
  and time per device profile;
* :mod:`end2end.sweep`     sweeps of a config, command lines, processes, progress, locks,
  multi-node;
* :mod:`end2end.report`    the docs' generated blocks from the committed results;
* :mod:`end2end.plan`      planning a run: candidate layouts of a model on a cluster, pruned,
  simulated and ranked, the best as a config line and a launch command;
* :mod:`end2end.multi_node` the old name of the Figure 8 launcher (``multi_node.launch``);
* :mod:`end2end.reproduce` every figure and table in one command (``scripts/reproduce.sh``): runs
  the documented commands (the study suites' too, as commands) and writes one page of results.

The command names of earlier versions still work: ``python -m end2end.bench|plot|ab|profiling``
and ``python -m end2end.multi_node.launch`` forward to their modules here. The study suites
(``ablation/``, ``autotune/``, ``usability/``) stand above the harness; it never imports them.
"""
