RESULTS=docs/results/cpu_fusions.tsv bash end2end/run_all_single_node.sh end2end/configs/cpu_fusions.cfg --repeat 3 --require-quiet
