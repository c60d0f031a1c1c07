"""``python -m end2end.sweep``: sweep a config (:mod:`end2end.sweep.single_node`)."""

from end2end.sweep.single_node import main

raise SystemExit(main())
