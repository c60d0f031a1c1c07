RESULTS=docs/results/cpu_modern.tsv bash end2end/run_all_single_node.sh end2end/configs/cpu_modern.cfg --repeat 3
