RESULTS=docs/results/cpu_peers.tsv bash end2end/run_all_single_node.sh end2end/configs/cpu_peers.cfg --repeat 3 --require-quiet
