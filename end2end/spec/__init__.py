"""What a benchmark run is: the config grammar (:mod:`.config_file`), the safe BATCH_SIZE
evaluator (:mod:`.expr`), typed runs and their keys (:mod:`.runspec`), model-schedule knobs
(:mod:`.knobs`) and the one table of modes (:mod:`.modes`)."""
