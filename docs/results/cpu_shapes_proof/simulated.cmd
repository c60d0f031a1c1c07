python -m end2end.simulate.proof end2end/configs/cpu_shapes.cfg --measured docs/results/cpu_shapes_proof/measured.tsv --calibration docs/results/cpu_proof/cpu_profile.json --out docs/results/cpu_shapes_proof
# simulated 2026-12-03 18:35-18:38 UTC from a clean worktree of f3735ec (the measured rows unchanged: measured.tsv; run there with --out results/cpu_shapes_proof, the files moved here)
