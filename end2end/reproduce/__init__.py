"""``bash scripts/reproduce.sh [--quick | --full] [--out DIR]``: every figure and table of the
paper at CPU scale, and the paper-scale predictions, in one resumable command that ends with one
page (``DIR/index.md`` and ``DIR/index.html``) laying each result beside the committed one and
the paper's value (issue 38).

* :mod:`.plan` — the steps of the ``quick`` and ``full`` plans (the documented commands);
* :mod:`.runner` — runs them with a progress line per step, resumable;
* :mod:`.page` — the index page from the results (report blocks; no number of its own);
* :mod:`.__main__` — the command line (``python -m end2end.reproduce``).

It sits at the top of the harness (contract ``end2end-layers``): it runs the study suites
(``ablation/``, ``autotune/``, ``usability/``) as commands, never imports them.
"""
