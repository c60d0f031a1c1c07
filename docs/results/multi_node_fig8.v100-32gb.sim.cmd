/work/main/.venv/bin/python -m end2end.simulate end2end/configs/multi_node_fig8.cfg --device v100-32gb --results docs/results/multi_node_fig8.v100-32gb.sim.tsv
/work/main/.venv/bin/python -m end2end.plot docs/results/multi_node_fig8.v100-32gb.sim.tsv -o docs/results/multi_node_fig8-fig7
