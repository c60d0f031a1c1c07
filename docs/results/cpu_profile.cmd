python -m end2end.simulate.calibrate --out docs/results/cpu_proof/cpu_profile.json  # run by the proof (--calibrate), 2026-12-02 06:36 UTC
python -m end2end.simulate.calibrate --memory-only --out docs/results/cpu_proof/cpu_profile.json
cp docs/results/cpu_proof/cpu_profile.json docs/results/cpu_profile.json
