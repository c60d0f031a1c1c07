python -m end2end.simulate end2end/configs/single_node_asplos24.cfg --device v100-32gb --results docs/results/single_node_asplos24.v100-32gb.sim.tsv
