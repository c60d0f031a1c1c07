python -m end2end.simulate.proof end2end/configs/cpu_shapes.cfg --measured docs/results/cpu_shapes_proof/measured.tsv --calibration docs/results/cpu_proof/cpu_profile.json --out docs/results/cpu_shapes_proof
# simulated 2026-12-04 22:21-22:23 UTC from a clean worktree of 8966d60 (the measured rows and the calibration unchanged; the simulated rows of f3735ec are in git history)
