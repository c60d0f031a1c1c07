"""Running many runs: a config swept through the driver on one node (:mod:`.single_node`,
``python -m end2end.sweep``), the driver's command lines (:mod:`.commands`), process trees
(:mod:`.procs`), progress (:mod:`.progress`), the one-sweep-per-results-file lock (:mod:`.lock`)
and the multi-node launcher (:mod:`.multi_node`)."""
