"""The command name ``python -m end2end.multi_node.launch`` (:mod:`end2end.sweep.multi_node`)."""
