"""Generated blocks of the docs: every number the docs quote comes from a committed results file.

``python -m end2end.report`` rewrites the blocks between ``<!-- report: NAME ARGS -->`` and
``<!-- /report -->`` in README.md, docs/*.md and the experiment READMEs from ``docs/results/``
(:mod:`end2end.report.generators` lists the block kinds); ``--check`` rewrites nothing and exits 1
naming the first block that differs, so a results file or a block edited by hand fails the test
suite. :mod:`end2end.report.blocks` finds and replaces the blocks.
"""
