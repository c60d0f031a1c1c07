"""``python -m end2end.multi_node.launch``: the multi-node launcher
(:mod:`end2end.sweep.multi_node`); kept as a command name."""

from end2end.sweep.multi_node import main

if __name__ == "__main__":
    raise SystemExit(main())
