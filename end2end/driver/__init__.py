"""The one training driver (:mod:`.bench`: one run, one row) and what it is built from: the
runtime of each mode (:mod:`.runtimes`, baselines in :mod:`.baselines`), measurement
(:mod:`.measure`), profiling (:mod:`.profiling`), pipeline plans (:mod:`.pipeline_plan`) and the
paired A/B check of two modes (:mod:`.ab`)."""
