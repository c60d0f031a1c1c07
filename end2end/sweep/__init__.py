"""Running many runs: a config swept through the driver on one node (:mod:`.single_node`,
``python -m end2end.sweep``), the driver's command lines (:mod:`.commands`), process trees and
jobs of one command per node (:mod:`.procs`), what every sweep does around a run: pending runs,
the row of a run that died, the interrupt exit (:mod:`.outcome`), progress (:mod:`.progress`),
the one-sweep-per-results-file lock (:mod:`.lock`), the multi-node launcher (:mod:`.multi_node`)
and its Slurm jobs (:mod:`.slurm`)."""
