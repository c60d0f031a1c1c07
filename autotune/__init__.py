"""Figure 10 suite: the benchmark driver as a ``slapo.autotune`` objective, per-model spaces.

``slapo.autotune`` is generic (it never imports the harness); this package adapts
``end2end.bench``: :mod:`autotune.driver` runs one driver launch per candidate and prints the
JSON result line a command objective reads, and ``autotune/spaces/*.py`` are space files for
``python -m slapo.autotune --space``.
"""
