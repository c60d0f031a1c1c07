/work/main/.venv/bin/python -m end2end.simulate ablation/configs/paper-bert.cfg --device v100-32gb --results docs/results/ablation-paper-bert.v100-32gb.sim.tsv
