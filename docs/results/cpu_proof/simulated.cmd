python -m end2end.simulate.proof end2end/configs/cpu.cfg --measured docs/results/cpu_proof/measured.tsv --calibration docs/results/cpu_proof/cpu_profile.json --out docs/results/cpu_proof
