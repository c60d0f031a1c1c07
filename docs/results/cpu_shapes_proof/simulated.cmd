python -m end2end.simulate.proof end2end/configs/cpu_shapes.cfg --calibration docs/results/cpu_proof/cpu_profile.json --out docs/results/cpu_shapes_proof
