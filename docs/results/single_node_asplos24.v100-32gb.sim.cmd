/work/main/.venv/bin/python -m end2end.simulate end2end/configs/single_node_asplos24.cfg --device v100-32gb --results docs/results/single_node_asplos24.v100-32gb.sim.tsv
/work/main/.venv/bin/python -m end2end.plot docs/results/single_node_asplos24.v100-32gb.sim.tsv -o docs/results/single_node_asplos24-fig7
