python -m end2end.simulate.proof end2end/configs/cpu_shapes.cfg --measured docs/results/cpu_shapes_proof/measured.tsv --calibration docs/results/cpu_proof/cpu_profile.json --out docs/results/cpu_shapes_proof
# simulated 2026-12-05 01:18-01:19 UTC from a clean worktree of 1b5880c (the measured rows and the calibration unchanged; the simulated rows of 8966d60 and f3735ec are in git history)
