python -m end2end.simulate ablation/configs/paper-gpt-neo.cfg --device v100-32gb --results docs/results/ablation-paper-gpt-neo.v100-32gb.sim.tsv
