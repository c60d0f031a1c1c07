"""Planning a training run: a model and a cluster in, the best Slapo schedule and layout out,
predicted by the simulator (``python -m end2end.plan``, docs/planning.md).

The package in the order a plan runs: ``cluster.py`` the cluster spec (``h100-80gb:8x4``);
``space.py`` the candidates (mode, TP, PP, DP, micro-batch, CKPT) as config lines the driver
accepts; ``rules.py`` pruning before simulation (divisibility, memory lower bound);
``estimate.py`` a first-order time and memory estimate that orders the simulations;
``shapes.py`` a model's name with a size changed (reduced depth, longer sequences);
``predict.py`` a candidate simulated (whole, or at two reduced depths and extrapolated), cached
on disk;
``search.py`` :func:`plan`, the search within a budget; ``report.py`` the table, the best
config and launch command, ``--explain`` and ``--json``; ``check.py`` the extrapolation against
full-depth simulations (``--check``); ``__main__.py`` the command line;
``layouts.py`` the table of layouts published runs chose and ``published.py`` the planner
against them (``python -m end2end.plan.published``); ``limits.py`` what a study restricts the
space to (CKPT values, TP, PP, accumulation), ``measured.py`` the planner's grid measured on
this CPU, ``study_report.py`` its picks against the measurements and ``cpu_study.py`` the
command (``python -m end2end.plan.cpu_study``).

``plan(model, cluster, seq, ...)`` returns a :class:`PlanResult` whose ``ranked`` candidates
other tools read (a validation against published layouts, a measured study).
"""

from end2end.plan.cluster import Cluster, ClusterError, parse_cluster
from end2end.plan.search import Evaluated, PlanResult, SearchOptions, plan
from end2end.plan.space import Candidate

__all__ = ["Cluster", "ClusterError", "parse_cluster", "plan", "PlanResult", "Evaluated",
           "SearchOptions", "Candidate"]
