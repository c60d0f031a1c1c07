python -m end2end.simulate.proof end2end/configs/cpu_holdout.cfg --calibrate --out docs/results/cpu_holdout_proof
