python -m end2end.simulate.proof end2end/configs/cpu.cfg --calibrate --out docs/results/cpu_proof
